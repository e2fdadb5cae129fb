/**
 * A scripted mobile client against the real all-in-one process (`autopush --bridge-stub`): it
 * registers through the stub bridge, gets a push routed to it (seen in `/__trace__` with its
 * urgency), rotates its router data with PUT (the next push follows it), lists its channels, and
 * unregisters — after which its endpoint is gone.
 */
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { type Deployment, startAllInOne } from "../e2e/servers.ts"

let deployment: Deployment

beforeAll(async () => {
  deployment = await startAllInOne(["--bridge-stub"])
})

afterAll(async () => {
  await deployment?.stop()
})

const api = async (method: string, path: string, body?: unknown, secret?: string) => {
  const res = await fetch(`${deployment.endpointUrl}${path}`, {
    method,
    headers: {
      ...(body !== undefined ? { "content-type": "application/json" } : {}),
      ...(secret !== undefined ? { authorization: `Bearer ${secret}` } : {})
    },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {})
  })
  const text = await res.text()
  return { status: res.status, json: text === "" ? undefined : JSON.parse(text), headers: res.headers }
}

const push = (endpoint: string, headers: Record<string, string> = {}) =>
  fetch(endpoint, {
    method: "POST",
    headers: { TTL: "600", "Content-Encoding": "aes128gcm", ...headers },
    body: "pretend-ciphertext"
  }).then(async (res) => ({ status: res.status, location: res.headers.get("location"), body: await res.text() }))

describe("mobile client through the stub bridge, against a running endpoint node", () => {
  it("registers, receives a push, rotates its router data, lists channels, unregisters", async () => {
    const registered = await api("POST", "/v1/stub/success/registration", { token: "success" })
    assert.strictEqual(registered.status, 200)
    const { uaid, channelID, endpoint, secret } = registered.json as Record<string, string>
    assert.isTrue(endpoint?.startsWith(`${deployment.endpointUrl}/wpush/`))

    const first = await push(endpoint ?? "", { Urgency: "high" })
    assert.strictEqual(first.status, 201)
    const messageId = (first.location ?? "").split("/m/")[1] ?? ""
    const trace = await fetch(`${deployment.routerUrl}/__trace__/${messageId}`).then((r) => r.json()) as {
      state: string
      events: Array<{ type: string; data: Record<string, unknown> }>
    }
    assert.strictEqual(trace.state, "bridged")
    assert.deepInclude(trace.events.find((e) => e.type === "notification.bridged.1")?.data, { platform: "stub", urgency: "high" })

    const base = `/v1/stub/error/registration/${uaid}`
    assert.strictEqual((await api("PUT", base, { token: "success" }, "wrong-secret")).status, 401)
    assert.strictEqual((await api("PUT", base, { token: "success" }, secret)).status, 200)
    assert.strictEqual((await push(endpoint ?? "")).status, 502, "routed with the new router data (the stub's error app)")
    assert.strictEqual((await api("PUT", `/v1/stub/success/registration/${uaid}`, { token: "success" }, secret)).status, 200)
    assert.strictEqual((await push(endpoint ?? "")).status, 201)

    const listed = await api("GET", `/v1/stub/success/registration/${uaid}`, undefined, secret)
    assert.deepStrictEqual(listed.json, { uaid, channelIDs: [channelID] })

    assert.strictEqual((await api("DELETE", `/v1/stub/success/registration/${uaid}`, undefined, secret)).status, 200)
    const gone = await push(endpoint ?? "")
    assert.strictEqual(gone.status, 410)
    assert.strictEqual(JSON.parse(gone.body).errno, 106)
    const after = await api("GET", `/v1/stub/success/registration/${uaid}`, undefined, secret)
    assert.deepStrictEqual([after.status, after.json?.errno], [410, 103])
  })
})
