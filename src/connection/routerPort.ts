/**
 * The node's private router port: its server (request and idle bounds, not capped per address: its
 * clients are the deployment's endpoint nodes and operators) and the guard of its router API — the
 * deployment's signatures, checked on the node's clock, refusals counted by reason.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { createServer } from "node:http"
import { RouterAuth } from "../crypto/routerAuth.ts"
import { type Counter, Metrics, type MetricsService } from "../observability/Metrics.ts"
import { METRICS } from "../observability/catalog.ts"
import { routerObservability } from "../observability/observability.ts"
import { portCounters } from "../observability/sockets.ts"
import { answerSocketErrors } from "../platform/raw-http.ts"
import { listen } from "../platform/listen.ts"
import { capPerAddress, countIdleCloses } from "../platform/socket-limits.ts"
import type { NodeFibers } from "./fibers.ts"
import type { HealthSource, HttpPortLimits } from "./http.ts"
import type { NodeRegistryService } from "./registry.ts"
import { handleRouterRequest, type RouterGuard } from "./routerRoutes.ts"

const routerGuard = (metrics: MetricsService, fibers: NodeFibers) =>
  Effect.gen(function*() {
    const clock = yield* Clock.Clock
    const authNotes = new Map<string, Counter>()
    return {
      auth: yield* RouterAuth,
      // Signatures carry the signer's wall-clock time: checked against this node's.
      now: () => clock.currentTimeMillisUnsafe(),
      noted: (reason, route) => {
        let counter = authNotes.get(reason)
        if (counter === undefined) authNotes.set(reason, counter = metrics.counter(METRICS.routerAuthRefused.name, { reason }))
        counter.inc()
        // Neither the signature nor the path (it names a client): the reason and the route only.
        if (reason !== "accepted_unsigned") void fibers.run(Effect.logDebug("router request refused").pipe(Effect.annotateLogs({ reason, route })))
      }
    } satisfies RouterGuard
  })

/** Listen on the router port; its bound port number. */
export const serveRouterPort = (
  { registry, health, fibers, limits, options }: {
    readonly registry: NodeRegistryService
    readonly health: HealthSource
    readonly fibers: NodeFibers
    readonly limits: HttpPortLimits
    readonly options: { readonly routerPort: number; readonly routerBindHost: string; readonly clientRequestTimeoutMs: number }
  }
) =>
  Effect.gen(function*() {
    const observability = yield* routerObservability(registry)
    const metrics = yield* Metrics
    const counters = portCounters(metrics, "router")
    const guard = yield* routerGuard(metrics, fibers)
    const listener = handleRouterRequest(registry, health, guard, observability, options.clientRequestTimeoutMs)
    const server = capPerAddress(
      countIdleCloses(answerSocketErrors(createServer(limits.serverOptions, listener), () => counters.timedOut("request")), counters),
      { maxPerAddress: 0, exempt: [] },
      counters,
      () => {}
    )
    return yield* listen(server, options.routerPort, options.routerBindHost, "router_port")
  })
