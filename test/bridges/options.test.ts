/**
 * Bridge configuration as operators write it (JSON maps, PEM or file paths): what it becomes, and
 * the one-line start-up error naming the option when it is unusable — never echoing its secrets.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { bridgeOptionsOf, type BridgeSettings } from "../../src/bridges/Bridges.ts"

const base: BridgeSettings = {
  stub: false,
  fcmMinTtl: 60,
  fcmMaxTtl: 2_419_200,
  fcmTimeoutMs: 3000,
  fcmBaseUrl: "https://fcm.googleapis.com",
  apnsTimeoutMs: 20_000,
  admMinTtl: 60,
  admMaxTtl: 2_419_200,
  admTimeoutMs: 3000,
  admBaseUrl: "https://api.amazon.com"
}

const PEM = "-----BEGIN PRIVATE KEY-----\nMIIsecret\n-----END PRIVATE KEY-----\n"
const account = { client_email: "a@b.iam.gserviceaccount.com", private_key: PEM }

const failure = (settings: Partial<BridgeSettings>) =>
  Effect.flip(bridgeOptionsOf({ ...base, ...settings })).pipe(Effect.map((e) => e.message))

describe("bridge options", () => {
  it.effect("nothing configured: no bridges", () =>
    Effect.gen(function*() {
      const options = yield* bridgeOptionsOf(base)
      assert.deepStrictEqual([options.fcm, options.apns, options.adm], [undefined, undefined, undefined])
    }))

  it.effect("FCM credential inline or as a file path; APNs token/certificate auth and default topic; ADM secret redacted", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "bridge-options-"))
      try {
        const file = join(dir, "sa.json")
        writeFileSync(file, JSON.stringify(account))
        const options = yield* bridgeOptionsOf({
          ...base,
          fcmCredentials: JSON.stringify({
            inline: { project_id: "p1", credential: JSON.stringify(account) },
            fromFile: { project_id: "p2", credential: file }
          }),
          apnsChannels: JSON.stringify({
            firefox: { key: PEM, key_id: "K", team_id: "T" },
            beta: { cert: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----", key: PEM, topic: "org.x", sandbox: true }
          }),
          admCredentials: JSON.stringify({ fire: { client_id: "id", client_secret: "s3cret" } })
        })
        const fromFile = options.fcm?.apps["fromFile"]
        assert.strictEqual(fromFile?.projectId, "p2")
        assert.strictEqual(fromFile?.serviceAccount.client_email, account.client_email)
        assert.strictEqual(Redacted.value(fromFile?.serviceAccount.private_key ?? Redacted.make("")), PEM)
        assert.strictEqual(options.fcm?.apps["inline"]?.projectId, "p1")
        const firefox = options.apns?.channels["firefox"]
        assert.deepInclude(firefox, { topic: "com.mozilla.org.firefox", sandbox: false })
        assert.deepInclude(firefox?.auth, { kind: "token", keyId: "K", teamId: "T" })
        assert.strictEqual(firefox?.auth.kind === "token" ? Redacted.value(firefox.auth.key) : "", PEM)
        // Keys are kept redacted: printing the options shows none of them.
        assert.notInclude(JSON.stringify(options), "MIIsecret")
        assert.strictEqual(options.apns?.channels["beta"]?.auth.kind, "certificate")
        assert.isTrue(options.apns?.channels["beta"]?.sandbox)
        const secret = options.adm?.profiles["fire"]?.clientSecret
        assert.isTrue(secret !== undefined && Redacted.isRedacted(secret) && Redacted.value(secret) === "s3cret")
        assert.notInclude(String(secret), "s3cret")
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    }))

  it.effect("unusable values: one line naming the option, without the value", () =>
    Effect.gen(function*() {
      assert.strictEqual(yield* failure({ fcmCredentials: "{oops" }), "option fcm_credentials is not usable: the value is not valid JSON")
      assert.strictEqual(
        yield* failure({ fcmCredentials: JSON.stringify({ a: { project_id: "p", credential: "{not json" } }) }),
        "option fcm_credentials is not usable: a credential is not valid JSON"
      )
      assert.match(yield* failure({ fcmCredentials: JSON.stringify({ a: { project_id: "p", credential: "/no/such/file.json" } }) }), /fcm_credentials.*cannot read the file/)
      assert.match(yield* failure({ fcmCredentials: JSON.stringify({ a: { credential: JSON.stringify(account) } }) }), /fcm_credentials.*project_id/)
      const apns = yield* failure({ apnsChannels: JSON.stringify({ c: { key: PEM, key_id: "K" } }) })
      assert.strictEqual(apns, "option apns_channels is not usable: c: key_id and team_id go together")
      const adm = yield* failure({ admCredentials: JSON.stringify({ fire: { client_id: "id", client_secret: "" } }) })
      assert.match(adm, /^option adm_credentials is not usable: fire: client_secret/)
      assert.notInclude(yield* failure({ fcmCredentials: `{"a": {"project_id": "p", "credential": ${JSON.stringify(PEM)}` }), "MIIsecret")
    }))
})
