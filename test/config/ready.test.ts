/**
 * The start-up "ready" line: the URLs to use, and whether the web console is public, asks for a
 * token or is off (never the token itself).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { readyLine } from "../../src/bin/app.ts"
import { sandbox } from "./sandbox.ts"

describe("ready line", () => {
  it.effect("says whether the console is public, token-guarded or off", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const line = (argv: ReadonlyArray<string>) => Effect.map(box.load("autopush", { argv }), (s) => readyLine("autopush", s))
      assert.strictEqual(
        yield* line([]),
        "ready: WebSocket ws://localhost:8080/ · Web Push API http://localhost:8082/wpush/… · web console http://localhost:8082/ (public)"
      )
      const guarded = yield* line(["--console-token", "s3cret-console"])
      assert.isTrue(guarded.endsWith("· web console http://localhost:8082/?token=… (console_token required)"), guarded)
      assert.notInclude(guarded, "s3cret-console")
      assert.isTrue((yield* line(["--console=false"])).endsWith("· web console off"))
      const endpointNode = yield* Effect.map(box.load("autoendpoint", { argv: ["--console=false"] }), (s) => readyLine("autoendpoint", s))
      assert.strictEqual(endpointNode, "ready: Web Push API http://localhost:8082/wpush/… · web console off")
      const connectionNode = yield* Effect.map(box.load("autoconnect"), (s) => readyLine("autoconnect", s))
      assert.notInclude(connectionNode, "console")
    }))

  it.effect("an https endpoint (its own TLS) still advertises the plain ws:// the WebSocket port speaks; websocket_url as given", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const line = (argv: ReadonlyArray<string>) => Effect.map(box.load("autopush", { argv }), (s) => readyLine("autopush", s))
      assert.isTrue(
        (yield* line(["--endpoint-scheme", "https", "--endpoint-port", "443"])).startsWith("ready: WebSocket ws://localhost:8080/ · Web Push API https://localhost/wpush/…")
      )
      assert.isTrue((yield* line(["--endpoint-scheme", "https", "--websocket-url", "wss://push.example.com/"])).startsWith("ready: WebSocket wss://push.example.com/ · "))
    }))
})
