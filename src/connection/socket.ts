/**
 * The node's WebSocket: a `ws` socket that is also its session's transport, and the limits every
 * socket of the node shares (send buffer, control-frame rate, inbox bound, close grace).
 */
import { type RawData, WebSocket } from "ws"
import { closeFrame } from "../protocol/close.ts"
import { type Counter, type MetricsService } from "../observability/Metrics.ts"
import { METRICS } from "../observability/catalog.ts"
import { type MailboxInput, textFrame } from "../protocol/inputs.ts"
import type { InboxBound, InboxGate, Mailbox } from "../protocol/mailbox.ts"
import type { SessionHandle, Transport } from "../protocol/session.ts"

export interface TransportLimits {
  readonly closeGraceMs: number
  readonly maxSendBufferBytes: number
  readonly maxControlFramesPerSecond: number
  /** The client's frames waiting in its mailbox at which its socket stops being read. */
  readonly inbox: InboxBound
  /** Counted each time a socket stops being read, by why. */
  readonly pausedFor: { readonly [R in Exclude<PauseReason, "closing">]: Counter }
  /** A bug in a `ws` callback: logged, and the socket closed 1011 — never the process. */
  readonly defect: (where: string, cause: unknown) => void
}

/** The limits of the node's sockets, from its options; `defect` logs a bug in a `ws` callback. */
export const transportLimits = (
  options: {
    readonly closeGraceMs: number
    readonly maxSendBufferBytes: number
    readonly maxControlFramesPerSecond: number
    readonly inboxFrames: number
    readonly inboxBytes: number
  },
  metrics: MetricsService,
  defect: TransportLimits["defect"]
): TransportLimits => ({
  closeGraceMs: options.closeGraceMs,
  maxSendBufferBytes: options.maxSendBufferBytes,
  maxControlFramesPerSecond: options.maxControlFramesPerSecond,
  inbox: { frames: options.inboxFrames, bytes: options.inboxBytes },
  pausedFor: {
    inbox: metrics.counter(METRICS.paused.name, { reason: "inbox" }),
    commands: metrics.counter(METRICS.paused.name, { reason: "commands" })
  },
  defect
})

/**
 * Why a socket is not read (any one is enough): its inbox is full, its commands wait for the budget,
 * or its session is closing (nothing it sends matters any more; not counted as a pause).
 */
type PauseReason = "inbox" | "commands" | "closing"
const PAUSED_BY: { readonly [R in PauseReason]: number } = { inbox: 1, commands: 2, closing: 4 }

/**
 * A `ws` socket that is also its session's transport: `ws` makes it (the server's `WebSocket`
 * option) and its events go straight to the session's mailbox, with no listener, closure or side
 * object per connection (memory per connection).
 */
export class PushSocket extends WebSocket implements Transport, InboxGate {
  /** Set by `accept` before any frame can arrive. */
  handle: SessionHandle | undefined = undefined
  limits: TransportLimits | undefined = undefined
  /** Control frames in the current one-second window, and when it began. */
  controlFrames = 0
  controlWindow = 0
  /** The client stopped reading: nothing more is sent, the session is being closed. */
  stalled = false
  /** The reasons (`PAUSED_BY` bits) the socket is not read now; read while 0. */
  pausedBy = 0
  /**
   * No listener table (a dictionary object, 184 bytes per connection): nothing listens on a
   * PushSocket, and EventEmitter makes the table afresh if a listener is ever added.
   */
  _events = undefined

  sendText(text: string): void {
    if (this.readyState !== this.OPEN || this.stalled) return
    if (this.bufferedAmount > (this.limits as TransportLimits).maxSendBufferBytes) {
      // Its unacked messages are saved by the session's close; other clients are not held up.
      this.stalled = true
      this.handle?.mailbox.offerFirst({ _tag: "Kick", kind: "slow-client" })
      return
    }
    this.send(text)
  }

  sendClose(code: number, reason: string): void {
    if (this.readyState === this.OPEN) this.close(code, reason)
    setTimeout(terminate, (this.limits as TransportLimits).closeGraceMs, this).unref()
  }

  /** The session's commands wait for the budget: stop reading until they are let through. */
  override pause(): void {
    this.hold("commands")
  }

  override resume(): void {
    this.release("commands")
  }

  /** The mailbox holds as many of the client's frames as it may: stop reading until it drained. */
  inboxFull(): void {
    this.hold("inbox")
  }

  inboxDrained(): void {
    this.release("inbox")
  }

  /** The session is going away: what the client sends is not read any more (the socket ends after the close grace). */
  closing(): void {
    this.hold("closing")
  }

  private hold(reason: PauseReason): void {
    const bit = PAUSED_BY[reason]
    if ((this.pausedBy & bit) !== 0) return
    if (reason !== "closing") (this.limits as TransportLimits).pausedFor[reason].inc()
    if (this.pausedBy === 0) super.pause()
    this.pausedBy |= bit
  }

  private release(reason: PauseReason): void {
    const bit = PAUSED_BY[reason]
    if ((this.pausedBy & bit) === 0) return
    this.pausedBy &= ~bit
    if (this.pausedBy === 0) super.resume()
  }

  sendPing(): void {
    if (this.readyState === this.OPEN) this.ping()
  }

  /** `ws` events, in place of listeners; a bug here closes this socket (1011) and is logged, never thrown. */
  override emit(event: string | symbol, ...args: Array<any>): boolean {
    const mailbox = this.handle?.mailbox
    if (mailbox === undefined) return false
    try {
      switch (event) {
        case "message":
          onMessage(this, mailbox, args[0], args[1])
          break
        case "ping":
          if (this.control(performance.now())) this.pong(args[0])
          else this.flooded(mailbox)
          break
        case "pong":
          if (this.control(performance.now())) mailbox.offer({ _tag: "Pong" })
          else this.flooded(mailbox)
          break
        case "close":
          mailbox.offer({ _tag: "SocketClosed" })
          break
        case "error":
          this.terminate()
          break
        default:
          return false
      }
    } catch (cause) {
      ;(this.limits as TransportLimits).defect(String(event), cause)
      const { code, reason } = closeFrame("internal-error")
      this.sendClose(code, reason)
    }
    return true
  }

  /** Too many control frames: the session is closed, and nothing more the client sends is read. */
  private flooded(mailbox: Mailbox<MailboxInput>): void {
    mailbox.offerFirst({ _tag: "Kick", kind: "control-flood" })
    this.closing()
  }

  /** Count a control frame from the client; false once it sends more than its share this second. */
  private control(now: number): boolean {
    if (now - this.controlWindow >= 1_000) {
      this.controlWindow = now
      this.controlFrames = 0
    }
    return ++this.controlFrames <= (this.limits as TransportLimits).maxControlFramesPerSecond
  }
}

const terminate = (socket: PushSocket): void => socket.terminate()

/**
 * A client's message into its inbox, weighed by its bytes (reading stops while the inbox is full).
 * Once the session is going away nothing more it sends matters: the socket is not read any more
 * (it is ended after the close grace), and what was read already is not decoded.
 */
const onMessage = (socket: PushSocket, mailbox: Mailbox<MailboxInput>, data: RawData, isBinary: boolean): void => {
  if (mailbox.isClosed) return socket.closing()
  const bytes = Array.isArray(data) ? data.reduce((sum, part) => sum + part.length, 0) : data.byteLength
  if (isBinary) return void mailbox.offerFrame({ _tag: "BinaryFrame" }, bytes)
  mailbox.offerFrame(textFrame(data.toString()), bytes)
}
