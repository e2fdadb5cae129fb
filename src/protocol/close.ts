/**
 * Why the server closes a WebSocket, as one tagged error carrying its kind; `closeFrame` is the one
 * mapping to close code and reason (autopush-rs's codes and reasons, plus 4774 for excessive pings).
 * The table is keyed by every kind, so a new kind without a code does not typecheck.
 */

export type CloseKind =
  | "uaid-reset" // msg_limit exceeded or stale month: the next hello gets a new uaid
  | "invalid-json" // non-JSON, unknown messageType, missing fields
  | "binary-frame"
  | "expected-hello" // anything but hello before hello
  | "already-hello" // a second hello
  | "already-connected" // a newer connection of this uaid exists
  | "ghost" // this uaid connected again; this older session goes
  | "excessive-ping" // client pings faster than min_ping_interval: 4774 tells Firefox to back off
  | "storage-error"
  | "hello-timeout"
  | "pong-timeout"
  | "shutdown" // node draining: Firefox reconnects elsewhere
  | "internal-error" // a bug while handling this connection (logged); the node carries on
  | "slow-client" // the client does not read what it is sent (max_send_buffer): closed, its messages kept
  | "control-flood" // ping/pong frames faster than max_control_frames_per_second

const frames: { readonly [K in CloseKind]: { readonly code: number; readonly reason: string } } = {
  "uaid-reset": { code: 1000, reason: "UaidReset" },
  "invalid-json": { code: 1011, reason: "Json" },
  "binary-frame": { code: 1003, reason: "UnsupportedMessage" },
  "expected-hello": { code: 1011, reason: "ExpectedHello" },
  "already-hello": { code: 1011, reason: "AlreadyHello" },
  "already-connected": { code: 1011, reason: "AlreadyConnected" },
  ghost: { code: 1011, reason: "Ghost" },
  "excessive-ping": { code: 4774, reason: "ExcessivePing" },
  "storage-error": { code: 1011, reason: "StorageError" },
  "hello-timeout": { code: 1011, reason: "HandshakeTimeout" },
  "pong-timeout": { code: 1011, reason: "PongTimeout" },
  shutdown: { code: 1001, reason: "Shutdown" },
  "internal-error": { code: 1011, reason: "InternalError" },
  "slow-client": { code: 1013, reason: "SlowClient" },
  "control-flood": { code: 1008, reason: "ControlFlood" }
}

/** Every close frame the protocol sends (the README's close table must list each). */
export const closeFrames: ReadonlyArray<{ readonly code: number; readonly reason: string }> = Object.values(frames)

export const closeFrame = (kind: CloseKind): { readonly code: number; readonly reason: string } => frames[kind]
