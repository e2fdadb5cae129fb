/**
 * End to end over real sockets and real processes: a `ws` client speaks the push protocol to the
 * connection node, the `web-push` library sends to the endpoint node, the client decrypts with its
 * subscription keys and acks. Runs against the all-in-one process (embedded storage) and against
 * separate connection and endpoint processes sharing a dynalite server, and separate processes of
 * one host sharing its SQLite database.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import ece from "http_ece"
import { createECDH, randomBytes } from "node:crypto"
import webpush, { type PushSubscription } from "web-push"
import { openClient, type TestClient } from "../connection/client.ts"
import { type Deployment, deploymentFor, startAllInOne, startOnOneHost, startSeparate } from "./servers.ts"
import { ack } from "./userAgent.ts"

interface Subscriber {
  readonly client: TestClient
  readonly uaid: string
  readonly channelId: string
  readonly subscription: PushSubscription
  readonly decrypt: (frame: Record<string, unknown>) => string | undefined
}

const vapid = webpush.generateVAPIDKeys()
const vapidDetails = { subject: "mailto:ops@example.com", publicKey: vapid.publicKey, privateKey: vapid.privateKey }

const hello = async (deployment: Deployment, uaid?: string) => {
  const client = await openClient(deployment.wsUrl)
  client.send(uaid === undefined ? { messageType: "hello", use_webpush: true } : { messageType: "hello", uaid, use_webpush: true })
  const reply = await client.next((f) => f["messageType"] === "hello")
  return { client, uaid: reply["uaid"] as string }
}

/** A client that subscribes like Firefox: register (with the VAPID key when given), then its own ECDH keys. */
const subscribe = async (deployment: Deployment, withKey: boolean): Promise<Subscriber> => {
  const { client, uaid } = await hello(deployment)
  const channelId = crypto.randomUUID()
  const key = Buffer.from(vapid.publicKey, "base64url").toString("base64url") + "="
  client.send(withKey ? { messageType: "register", channelID: channelId, key } : { messageType: "register", channelID: channelId })
  const reply = await client.next((f) => f["messageType"] === "register")
  assert.strictEqual(reply["status"], 200)
  const ecdh = createECDH("prime256v1")
  ecdh.generateKeys()
  const auth = randomBytes(16)
  const subscription = {
    endpoint: reply["pushEndpoint"] as string,
    keys: { p256dh: ecdh.getPublicKey().toString("base64url"), auth: auth.toString("base64url") }
  }
  const decrypt = (frame: Record<string, unknown>) => {
    if (frame["data"] === undefined) return undefined
    const headers = frame["headers"] as Record<string, string>
    const body = Buffer.from(frame["data"] as string, "base64url")
    if (headers["encoding"] === "aes128gcm") {
      return ece.decrypt(body, { version: "aes128gcm", privateKey: ecdh, authSecret: auth }).toString()
    }
    const param = (header: string | undefined, name: string) =>
      header?.split(/[;,]/).map((p) => p.trim().split("=")).find(([k]) => k === name)?.[1]
    return ece.decrypt(body, {
      version: "aesgcm",
      privateKey: ecdh,
      authSecret: auth,
      dh: param(headers["crypto_key"], "dh")!,
      salt: param(headers["encryption"], "salt")!
    }).toString()
  }
  return { client, uaid, channelId, subscription, decrypt }
}

/**
 * Send with the `web-push` library: it builds the request (encryption, VAPID, TTL, Topic headers) and
 * we deliver it over plain HTTP (its own sender only speaks HTTPS).
 */
const sendNotification = async (
  subscription: PushSubscription,
  payload: string | null,
  options: { TTL: number; topic?: string; contentEncoding?: "aes128gcm" | "aesgcm"; vapidDetails?: typeof vapidDetails }
) => {
  const details = webpush.generateRequestDetails(subscription, payload, options)
  const headers = Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k, String(v)]))
  const res = await fetch(details.endpoint, { method: details.method, headers, ...(details.body === null ? {} : { body: details.body }) })
  return { statusCode: res.status, headers: Object.fromEntries(res.headers), body: await res.text() }
}

const isNotification = (f: Record<string, unknown>) => f["messageType"] === "notification"

const scenarios = (name: string, start: () => Promise<Deployment>) =>
  describe(name, () => {
    const deployment = deploymentFor(start)

    const live = (title: string, body: () => Promise<void>) =>
      it.live(title, () =>
        Effect.tryPromise({
          try: body,
          // On failure, show what the servers logged (the session's frames are in the debug log).
          catch: (e) => new Error(`${String(e)}\n--- server output (last 40 lines) ---\n${deployment().output.slice(-40).join("\n")}`)
        }), 30_000)

    for (const contentEncoding of ["aes128gcm", "aesgcm"] as const) {
      for (const withKey of [false, true]) {
        live(`${contentEncoding} payload to a ${withKey ? "v2 (VAPID-bound)" : "v1"} endpoint arrives, decrypts, and is not sent again after the ack`, async () => {
          const sub = await subscribe(deployment(), withKey)
          assert.match(sub.subscription.endpoint, withKey ? /\/wpush\/v2\// : /\/wpush\/v1\//)
          const text = `hello ${contentEncoding} ${withKey}`
          const sent = await sendNotification(sub.subscription, text, {
            contentEncoding,
            TTL: 60,
            ...(withKey ? { vapidDetails } : {})
          })
          assert.strictEqual(sent.statusCode, 201)
          assert.match(sent.headers["location"]!, new RegExp(`^${deployment().endpointUrl}/m/`))
          assert.strictEqual(sent.headers["ttl"], "60")
          const frame = await sub.client.next(isNotification)
          assert.strictEqual(sub.decrypt(frame), text)
          ack(sub.client, frame)
          await sub.client.close()
          const again = await hello(deployment(), sub.uaid)
          assert.strictEqual(again.uaid, sub.uaid)
          assert.isTrue(await again.client.quiet(300, isNotification))
          await again.client.close()
        })
      }
    }

    live("a v2 endpoint refuses a push without its VAPID key", async () => {
      const sub = await subscribe(deployment(), true)
      const error = await sendNotification(sub.subscription, "x", { TTL: 60 })
      assert.strictEqual(error.statusCode, 401)
      assert.strictEqual((JSON.parse(error.body) as { errno: number }).errno, 109)
      await sub.client.close()
    })

    live("messages sent while offline arrive on reconnect; a topic keeps only the newer; TTL 0 and cancelled ones never", async () => {
      const sub = await subscribe(deployment(), false)
      await sub.client.close()
      const send = (text: string | null, options: { TTL: number; topic?: string }) =>
        sendNotification(sub.subscription, text, { contentEncoding: "aes128gcm", ...options })
      await send("first", { TTL: 600 })
      await send("weather 1", { TTL: 600, topic: "weather" })
      await send("weather 2", { TTL: 600, topic: "weather" })
      await send("zero", { TTL: 0 })
      const cancelled = await send("cancelled", { TTL: 600 })
      const cancel = await fetch(cancelled.headers["location"]!, { method: "DELETE" })
      assert.strictEqual(cancel.status, 204)
      await send(null, { TTL: 600 })

      const again = await hello(deployment(), sub.uaid)
      const received: Array<string | undefined> = []
      for (let i = 0; i < 3; i++) {
        const frame = await again.client.next(isNotification)
        received.push(sub.decrypt(frame))
        ack(again.client, frame)
      }
      assert.sameMembers(received, ["weather 2", "first", undefined])
      assert.isTrue(await again.client.quiet(300, isNotification))
      await again.client.close()
    })

    live("the endpoint of an unregistered channel answers 410", async () => {
      const sub = await subscribe(deployment(), false)
      sub.client.send({ messageType: "unregister", channelID: sub.channelId })
      const reply = await sub.client.next((f) => f["messageType"] === "unregister")
      assert.strictEqual(reply["status"], 200)
      const error = await sendNotification(sub.subscription, "x", { TTL: 60 })
      assert.strictEqual(error.statusCode, 410)
      assert.strictEqual(error.headers["cache-control"], "max-age=86400")
      await sub.client.close()
    })

    live("every log line is MozLog JSON, and no uaid, endpoint token or payload appears in the logs", async () => {
      const sub = await subscribe(deployment(), true)
      const secret = "a payload that must not be logged"
      await sendNotification(sub.subscription, secret, { TTL: 60, vapidDetails })
      const frame = await sub.client.next(isNotification)
      ack(sub.client, frame)
      await sub.client.close()
      await new Promise((r) => setTimeout(r, 200))
      const lines = deployment().output.filter((l) => !l.startsWith("[")) // "[...]": lines the test harness adds
      assert.isAbove(lines.length, 10)
      for (const line of lines) {
        const record = JSON.parse(line) as Record<string, unknown>
        assert.strictEqual(record["EnvVersion"], "2.0", line)
        assert.match(String(record["Type"]), /^auto(push|connect|endpoint):log$/)
        for (const field of ["Timestamp", "Logger", "Hostname", "Severity", "Pid", "Fields"]) assert.property(record, field)
      }
      const token = new URL(sub.subscription.endpoint).pathname.split("/").pop()!
      const log = lines.join("\n")
      assert.include(log, "session event", "frames are logged at debug level")
      for (const leak of [sub.uaid, token, frame["version"] as string, frame["data"] as string, secret]) {
        assert.notInclude(log, leak)
      }
    })

    live("a restart keeps the uaid, the subscription and stored messages", async () => {
      const sub = await subscribe(deployment(), false)
      await sub.client.close()
      await sendNotification(sub.subscription, "before restart", { TTL: 600 })
      await deployment().restart()
      const again = await hello(deployment(), sub.uaid)
      assert.strictEqual(again.uaid, sub.uaid)
      const frame = await again.client.next(isNotification)
      assert.strictEqual(sub.decrypt(frame), "before restart")
      ack(again.client, frame)
      await sendNotification(sub.subscription, "after restart", { TTL: 600 })
      assert.strictEqual(sub.decrypt(await again.client.next(isNotification)), "after restart")
      await again.client.close()
    })
  })

scenarios("end to end: all-in-one process on embedded storage", startAllInOne)
scenarios("end to end: separate connection and endpoint processes on one dynalite", startSeparate)
scenarios("end to end: separate connection and endpoint processes of one host, sharing its SQLite database", () => startOnOneHost())
