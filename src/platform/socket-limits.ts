/**
 * Bounds on the connections of a listening port, shared by every port of both nodes:
 *
 * - time: a connection that sends nothing, or stalls before its first request is complete, is
 *   closed `requestTimeoutMs` after it connected (HTTP/1.1 gets a 408 first); a kept-alive
 *   HTTP/1.1 connection, or an HTTP/2 session without an open stream, is closed once idle for
 *   `idleTimeoutMs` (HTTP/2 with a GOAWAY). Node's HTTP server enforces the HTTP/1.1 parts (its
 *   `headersTimeout` and `keepAliveTimeout`, set from these); `endpoint/http2.ts` the rest;
 * - number: at most `maxPerAddress` connections open at once from one client address on a public
 *   port (IPv6 clients counted by their /64, as the rate limits count them); the addresses of
 *   `exempt` (the trusted proxies, the loopback) are never counted: behind a proxy, every client
 *   comes from it. A connection beyond the cap is answered 503 (`TooManyConnections`) and closed,
 *   or, where no HTTP answer can be written (before a TLS handshake), closed.
 *
 * Each bound's outcome is counted (`PortCounters`: `net.connection.refused{port,reason}`,
 * `net.connection.timeout{port,phase}`; `net.connections{port}` is the connections open).
 */
import { type BlockList, isIP, type Server, type Socket } from "node:net"
import { addressList, countedAddress, inList, LOOPBACK, plainAddress } from "./addresses.ts"

export interface SocketLimits {
  /** Time a connection has to send its first request (headers, or an HTTP/2 stream), from connecting (ms). */
  readonly requestTimeoutMs: number
  /** Time a kept-alive connection or an HTTP/2 session without a stream may stay idle (ms). */
  readonly idleTimeoutMs: number
  /** Connections open at once from one client address; 0: no cap. */
  readonly maxPerAddress: number
  /** Addresses and CIDR blocks not capped (trusted proxies, the loopback). */
  readonly exempt: ReadonlyArray<string>
}


/**
 * The defaults: a request within 10 s (`client_request_timeout`); 75 s idle (`client_idle_timeout`),
 * longer than the 60 s after which common load balancers and proxies drop an idle connection, so
 * that they close first and never send a request on a connection this node is closing; 1,000
 * connections per address (`max_connections_per_address`).
 */
export const DEFAULT_SOCKET_LIMITS: SocketLimits = {
  requestTimeoutMs: 10_000,
  idleTimeoutMs: 75_000,
  maxPerAddress: 1_000,
  exempt: LOOPBACK
}

/** Which port a count is about (a bounded label). */
export type PortLabel = "endpoint" | "websocket" | "router"

/** Why a connection was closed by a timer: nothing (or too little) arrived, or it stayed idle. */
export type TimeoutPhase = "request" | "idle"

/** What happens to a port's connections, counted (`observability/sockets.ts`). */
export interface PortCounters {
  readonly refused: (reason: "per_address" | "max_connections") => void
  readonly timedOut: (phase: TimeoutPhase) => void
  readonly opened: () => void
  readonly closed: () => void
}

/** Nothing counted. */
export const NO_COUNTERS: PortCounters = { refused: () => {}, timedOut: () => {}, opened: () => {}, closed: () => {} }

/** What a peer address is counted as; undefined: not counted (exempt, or no address). */
const addressKey = (exempt: BlockList, peer: string | undefined): string | undefined => {
  if (peer === undefined) return undefined
  const address = plainAddress(peer)
  if (isIP(address) === 0 || inList(exempt, address)) return undefined
  return countedAddress(address)
}

/**
 * `server` counting its connections (`net.connections`) and, when `limits.maxPerAddress` is above 0,
 * refusing a connection beyond that many from one address: `refuse` answers it (and closes it), and
 * it is counted. The refusal happens before any other listener sees the connection.
 */
export const capPerAddress = <S extends Server>(
  server: S,
  limits: Pick<SocketLimits, "maxPerAddress" | "exempt">,
  counters: PortCounters,
  refuse: (socket: Socket) => void
): S => {
  const exempt = addressList(limits.exempt)
  const open = new Map<string, number>()
  /** What each counted connection is counted as (an exempt or uncapped one has no entry). */
  const keys = new WeakMap<Socket, string>()
  // One listener for every connection of the port (`this` is the socket): a closure per connection
  // would hold its key, and `once` a wrapper around it (memory per connection).
  const onClose = function(this: Socket): void {
    counters.closed()
    const key = keys.get(this)
    if (key === undefined) return
    const count = (open.get(key) ?? 1) - 1
    if (count === 0) open.delete(key)
    else open.set(key, count)
  }
  const emit = server.emit.bind(server)
  server.emit = ((event: string | symbol, ...args: Array<unknown>): boolean => {
    if (event !== "connection") return emit(event as string, ...args)
    const socket = args[0] as Socket
    const key = limits.maxPerAddress > 0 ? addressKey(exempt, socket.remoteAddress) : undefined
    if (key !== undefined) {
      const count = open.get(key) ?? 0
      if (count >= limits.maxPerAddress) {
        counters.refused("per_address")
        refuse(socket)
        return true
      }
      open.set(key, count + 1)
      keys.set(socket, key)
    }
    counters.opened()
    // A socket emits `close` once.
    socket.on("close", onClose)
    return emit("connection", socket)
  }) as S["emit"]
  return server
}

/**
 * Node's HTTP server closing a kept-alive connection idle for `keepAliveTimeout`: counted as an
 * idle timeout. (With a `timeout` listener, Node leaves the closing to it.)
 */
export const countIdleCloses = <S extends Server>(server: S, counters: PortCounters): S => {
  server.on("timeout", (socket: Socket) => {
    counters.timedOut("idle")
    socket.destroy()
  })
  return server
}

/** Node's HTTP server options for `limits`: headers in time, idle connections closed. */
export const httpServerTimeouts = (limits: Pick<SocketLimits, "requestTimeoutMs" | "idleTimeoutMs">) => ({
  headersTimeout: limits.requestTimeoutMs,
  keepAliveTimeout: limits.idleTimeoutMs,
  // Node checks `headersTimeout` (and `requestTimeout`) only this often (30 s by default).
  connectionsCheckingInterval: Math.min(1_000, limits.requestTimeoutMs)
})
