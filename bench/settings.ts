/**
 * The settings of an all-in-one built in a bench's own process (as `npm start` builds it, on the
 * given ports, on loopback, with fresh keys).
 */
import { randomBytes } from "node:crypto"
import { tmpdir } from "node:os"
import { makeSettings } from "../src/config/index.ts"
import { generateFernetKey } from "../src/crypto/fernet.ts"

export const HOST = "127.0.0.1"

export const allInOneSettings = (wsPort: number, routerPort: number, endpointPort: number) =>
  makeSettings({
    hostname: HOST,
    port: wsPort,
    router_port: routerPort,
    router_hostname: HOST,
    endpoint_port: endpointPort,
    endpoint_hostname: HOST,
    bind_host: HOST,
    crypto_key: [generateFernetKey()],
    auth_keys: [randomBytes(32).toString("base64url")]
  }, tmpdir())
