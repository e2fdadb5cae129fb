/**
 * The endpoint under test with bridges: the usual test endpoint (fake connection nodes, in-memory
 * storage) plus an auth key and the given bridge options; helpers for the registration API.
 */
import { Effect, Layer, Logger, Redacted } from "effect"
import type { BridgeOptions } from "../../src/bridges/Bridges.ts"
import type { EndpointOptions } from "../../src/endpoint/options.ts"
import { TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { EventLogMemory } from "../../src/observability/EventLog.ts"
import { endpointWith, FakeNodeClient, options, type Reply, request } from "../endpoint/harness.ts"

export const AUTH_KEY = "bridge-test-auth-key"

/** The endpoint's log lines (rejections the tests provoke on purpose) are kept out of the test output. */
export const bridgedEndpoint = (bridges: BridgeOptions, more: Partial<EndpointOptions> = {}) =>
  endpointWith(FakeNodeClient, { ...options, authKeys: Redacted.make([AUTH_KEY]), bridges, ...more }).pipe(Layer.provide(Logger.layer([])))

export interface Registration {
  readonly uaid: string
  readonly channelID: string
  readonly endpoint: string
  readonly secret: string
}

/** JSON request to the endpoint; `secret` goes into `Authorization: Bearer`. */
export const call = (method: string, path: string, body?: unknown, secret?: string) =>
  request({
    method,
    path,
    headers: {
      ...(body !== undefined ? { "content-type": "application/json" } : {}),
      ...(secret !== undefined ? { authorization: `Bearer ${secret}` } : {})
    },
    ...(body !== undefined ? { body: typeof body === "string" ? body : JSON.stringify(body) } : {})
  })

/** POST .../registration, which must succeed. */
export const register = (routerType: string, appId: string, body: Record<string, unknown>) =>
  Effect.map(call("POST", `/v1/${routerType}/${appId}/registration`, body), (reply): Registration => {
    if (reply.status !== 200) throw new Error(`registration failed: ${reply.status} ${reply.text}`)
    return reply.json() as Registration
  })

/** The path of an endpoint URL (what we POST to). */
export const pathOf = (endpoint: string): string => {
  if (!endpoint.startsWith(TEST_ENDPOINT_URL)) throw new Error(`not our endpoint: ${endpoint}`)
  return new URL(endpoint).pathname
}

/** The error body's status and errno. */
export const errnoOf = (reply: Reply): [number, number | null] => [reply.status, reply.json().errno as number | null]

export const eventsOf = (uaid: string) =>
  Effect.map(Effect.service(EventLogMemory), (log) => log.events.filter((e) => e.uaid === uaid.replaceAll("-", "")))
