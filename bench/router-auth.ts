/**
 * `npm run bench:router-auth [-- --count N]`: what the router port's signature costs per request,
 * on the body sizes a delivery has (a notification without data, with a small payload, and with the
 * largest `max_data_bytes` payload, base64url in the transport JSON): signing (the sending node)
 * and verifying (the connection node), with one and with three `crypto_key`s listed (signed with
 * the first: verifying tries it first). Prints µs per request.
 */
import { randomBytes } from "node:crypto"
import { Redacted } from "effect"
import { generateFernetKey } from "../src/crypto/fernet.ts"
import { makeRouterAuth } from "../src/crypto/routerAuth.ts"
import { encodeTransportNotification } from "../src/domain/router-wire.ts"

const countArg = process.argv.indexOf("--count")
const COUNT = countArg === -1 ? 20_000 : Number(process.argv[countArg + 1])

const body = (dataBytes: number): string =>
  encodeTransportNotification({
    channelId: "eac8e1de-cddf-42d6-9919-a7b0e0f41e59",
    version: `gAAAAA${randomBytes(96).toString("base64url")}`,
    ttl: 60,
    timestamp: Math.floor(Date.now() / 1000),
    ...(dataBytes === 0 ? {} : { data: randomBytes(dataBytes).toString("base64url"), headers: { encoding: "aes128gcm" } })
  })

const path = "/push/0123abcd-0123-4567-89ab-0123456789ab"

const perRequestUs = (run: () => void): number => {
  for (let i = 0; i < COUNT; i++) run() // warm up: the plain-code HMAC is compiled by then
  const started = process.hrtime.bigint()
  for (let i = 0; i < COUNT; i++) run()
  return Number(process.hrtime.bigint() - started) / COUNT / 1_000
}

const rows: Array<Record<string, string>> = []
for (const keys of [1, 3]) {
  const auth = makeRouterAuth({ keys: Redacted.make(Array.from({ length: keys }, generateFernetKey)), acceptUnsigned: false })
  for (const [label, data] of [["no data", 0], ["256 B payload", 256], ["4096 B payload", 4096]] as const) {
    const text = body(data)
    const bytes = Buffer.from(text)
    const now = Date.now()
    const header = auth.sign(now, "PUT", path, undefined, text)
    if (auth.verify(now, header, "PUT", path, undefined, bytes) !== undefined) throw new Error("the signature does not verify")
    rows.push({
      "crypto keys": String(keys),
      body: `${label} (${bytes.length} B)`,
      "sign µs": perRequestUs(() => auth.sign(now, "PUT", path, undefined, text)).toFixed(2),
      "verify µs": perRequestUs(() => auth.verify(now, header, "PUT", path, undefined, bytes)).toFixed(2)
    })
  }
}
console.log(`router port signatures, ${COUNT} requests each`)
console.table(rows)
