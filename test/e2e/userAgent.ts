/**
 * A WebSocket client playing the user agent against a running deployment (hello, register, ack),
 * and the wrapper that puts a deployment's last output lines into a failing test's error.
 */
import { openClient, type TestClient } from "../connection/client.ts"
import type { Deployment } from "./servers.ts"

/** Say hello, as a new client or resuming `uaid`; the client and the uaid the server gave. */
export const helloAs = async (deployment: Deployment, uaid?: string): Promise<{ readonly client: TestClient; readonly uaid: string }> => {
  const client = await openClient(deployment.wsUrl)
  client.send({ messageType: "hello", use_webpush: true, ...(uaid === undefined ? {} : { uaid }) })
  const hello = await client.next((f) => f["messageType"] === "hello")
  return { client, uaid: hello["uaid"] as string }
}

/** Register a new channel: its push endpoint and channel id. */
export const register = async (client: TestClient): Promise<{ readonly endpoint: string; readonly channelID: string }> => {
  const channelID = crypto.randomUUID()
  client.send({ messageType: "register", channelID })
  return { endpoint: (await client.next((f) => f["messageType"] === "register"))["pushEndpoint"] as string, channelID }
}

/** Ack a notification frame (code 100: taken; Firefox sends 101/102 when it could not). */
export const ack = (client: TestClient, frame: Record<string, unknown>, code = 100) =>
  client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code }] })

/** A test body whose failure carries the deployment's last 30 output lines. */
export const withServerOutput = (deployment: () => Deployment) => <A>(run: () => Promise<A>) => () =>
  run().catch((error: unknown) => {
    throw new Error(`${String(error)}\n--- server output (last 30 lines) ---\n${deployment().output.slice(-30).join("\n")}`)
  })
