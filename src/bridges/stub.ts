/**
 * The stub bridge, for tests and demos of the registration API (autopush-rs' `stub` router): app id
 * `success` or `error`, token `success`. A message to a `success` user is accepted; to an `error`
 * user it fails like an upstream error (502). Off unless `bridge_stub` is set.
 */
import * as Effect from "effect/Effect"
import { InvalidRouterToken, UnknownBridgeTarget } from "../domain/errors.ts"
import { type BridgeRouter, dataMapOf, upstreamError } from "./bridge.ts"

export const makeStubRouter = (): BridgeRouter => ({
  platform: "stub",
  register: (appId, body) =>
    appId !== "success" && appId !== "error" ? Effect.fail(new UnknownBridgeTarget({ message: "Unknown stub app_id" }))
    : body.token !== "success" ? Effect.fail(new InvalidRouterToken())
    : Effect.succeed({ token: body.token, app_id: appId }),
  send: (user, notification) =>
    Effect.flatMap(dataMapOf(notification), () =>
      user.routerData["app_id"] === "error" ? Effect.fail(upstreamError("stub", 500, "General error")) : Effect.void)
})
