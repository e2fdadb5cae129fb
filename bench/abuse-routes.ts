/**
 * `bench:abuse`'s cases for the endpoint port's routes: one case per route, whose abuser sends the
 * route's most expensive requests (`test/endpoint/abusive.ts`: the longest header each protocol
 * allows made of the worst character for its parsers, unicode, repeated headers, registration
 * bodies of many keys or deep nesting), over HTTP/1.1 and HTTP/2 in turn, one after the other, for
 * the case's duration. Each request is timed from its first byte sent to its answer's end, on the
 * loopback: the server's time for it. The case's note says the worst, and how many were sent.
 *
 * The abuser has a subscription of its own (a WebSocket client that registers and never acks), so
 * that a push passes the token and the user to reach the header rules, and a message id of it; the
 * registration API's calls reach their bodies only where the node has the stub bridge and
 * `auth_keys` (else they are answered 400/108 at once).
 */
import { hello, push, register } from "./harness.ts"
import { HEADER_ROOM, PROTOCOLS, ROUTE_ABUSES, send, type Targets } from "../test/endpoint/abusive.ts"

/** A case of `bench:abuse` run in its process: its abuse until `until` (performance.now ms); what it did and its worst request. */
export interface InProcessCase {
  readonly name: string
  readonly run: (until: number) => Promise<{ readonly worstMs: number; readonly note: string }>
}

/** The node the cases abuse. */
export interface AbusedNode {
  readonly endpointUrl: string
  readonly wsUrl: string
  readonly routerUrl: string
}

/** What makes a group of in-process cases: the cases, and `close` for what it opened. */
export type InProcessCases = (node: AbusedNode) => Promise<{ readonly cases: ReadonlyArray<InProcessCase>; readonly close: () => Promise<void> }>

/** The endpoint's route cases; `close` ends the abuser's client. */
export const endpointRouteCases: InProcessCases = async ({ endpointUrl, wsUrl }) => {
  const client = await hello(wsUrl)
  const endpoint = await register(client)
  const pushed = await push(endpoint, Buffer.alloc(16))
  const targets: Targets = { pushPath: new URL(endpoint).pathname, messageId: pushed.messageId ?? "none" }
  const port = Number(new URL(endpointUrl).port)
  const routes = [...new Set(ROUTE_ABUSES.map((abuse) => abuse.route))]
  const cases = routes.map((route): InProcessCase => ({
    name: `route ${route}`,
    run: async (until) => {
      const abuses = ROUTE_ABUSES.filter((abuse) => abuse.route === route)
      let worstMs = 0
      let worstOf = ""
      let sent = 0
      const statuses = new Map<number, number>()
      for (let i = 0; performance.now() < until; i++) {
        const abuse = abuses[i % abuses.length]!
        const protocol = PROTOCOLS[Math.floor(i / abuses.length) % PROTOCOLS.length]!
        const answer = await send(port, protocol, abuse.request(HEADER_ROOM[protocol], protocol, targets))
        sent++
        statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1)
        if (answer.ms > worstMs) {
          worstMs = answer.ms
          worstOf = `${abuse.name} over ${protocol}`
        }
      }
      const answered = [...statuses].map(([status, count]) => `${count}× ${status}`).join(", ")
      return { worstMs, note: `${sent} requests (${answered}); worst ${worstMs.toFixed(1)} ms: ${worstOf}` }
    }
  }))
  return { cases, close: () => client.close() }
}
