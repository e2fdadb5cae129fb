/**
 * End to end through FCM: the real all-in-one process with `fcm_credentials` and `fcm_base_url`
 * pointed at the local FCM server (fake-fcm.ts); a mobile client registers with a VAPID key, the
 * `web-push` library sends encrypted pushes (aes128gcm and aesgcm, with Urgency), and what FCM
 * receives is enough for the device to decrypt them.
 */
import { createECDH, randomBytes } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import ece from "http_ece"
import webpush, { type RequestOptions } from "web-push"
import { startAllInOne } from "../e2e/servers.ts"
import { FakeFcm } from "./fake-fcm.ts"

const vapid = webpush.generateVAPIDKeys()
const vapidDetails = { subject: "mailto:ops@example.com", publicKey: vapid.publicKey, privateKey: vapid.privateKey }

const param = (header: string | undefined, name: string) =>
  header?.split(/[;,]/).map((p) => p.trim().split("=")).find(([k]) => k === name)?.[1]

describe("mobile client through FCM, against a running endpoint node", () => {
  layer(FakeFcm.layer, { excludeTestServices: true })((it) => {
    it.effect("registers with a VAPID key; web-push payloads reach FCM decryptable, with the urgency as priority", () =>
      Effect.scoped(Effect.gen(function*() {
        const fake = yield* FakeFcm
        const credential = JSON.stringify({ ...fake.account, private_key: Redacted.value(fake.account.private_key) })
        const deployment = yield* Effect.acquireRelease(
          Effect.promise(() =>
            startAllInOne([
              "--fcm-credentials", JSON.stringify({ firefox: { project_id: "e2e-project", credential } }),
              "--fcm-base-url", fake.url
            ])
          ),
          (d) => Effect.promise(() => d.stop())
        )
        yield* Effect.promise(async () => {
          const registered = await fetch(`${deployment.endpointUrl}/v1/fcm/firefox/registration`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ token: "fcm-device-token-e2e", key: vapid.publicKey })
          })
          assert.strictEqual(registered.status, 200)
          const { endpoint } = await registered.json() as { endpoint: string }
          assert.include(endpoint, "/wpush/v2/")

          const ecdh = createECDH("prime256v1")
          ecdh.generateKeys()
          const auth = randomBytes(16)
          const subscription = { endpoint, keys: { p256dh: ecdh.getPublicKey().toString("base64url"), auth: auth.toString("base64url") } }
          for (const contentEncoding of ["aes128gcm", "aesgcm"] as const) {
            const text = `hello mobile (${contentEncoding})`
            // web-push sends `Urgency` (its types do not declare the option).
            const options = { TTL: 300, contentEncoding, urgency: "high", vapidDetails } as RequestOptions
            const details = webpush.generateRequestDetails(subscription, text, options)
            const headers = Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k, String(v)]))
            const res = await fetch(details.endpoint, { method: details.method, headers, body: details.body ?? null })
            assert.strictEqual(res.status, 201, await res.text())

            const sent = fake.sends.at(-1)?.body.message
            assert.strictEqual(sent?.token, "fcm-device-token-e2e")
            assert.strictEqual(sent?.android.priority, "HIGH")
            assert.strictEqual(sent?.android.ttl, "300s")
            const data = sent?.android.data as Record<string, string>
            assert.strictEqual(data["con"], contentEncoding)
            const body = Buffer.from(data["body"] ?? "", "base64url")
            const plain = contentEncoding === "aes128gcm"
              ? ece.decrypt(body, { version: "aes128gcm", privateKey: ecdh, authSecret: auth })
              : ece.decrypt(body, {
                version: "aesgcm",
                privateKey: ecdh,
                authSecret: auth,
                dh: param(data["cryptokey"], "dh")!,
                salt: param(data["enc"], "salt")!
              })
            assert.strictEqual(plain.toString(), text)
          }
          // Nothing the processes printed names the device token in full.
          assert.isFalse(deployment.output.some((line) => line.includes("fcm-device-token-e2e")))
        })
      })), 60_000)
  })
})
