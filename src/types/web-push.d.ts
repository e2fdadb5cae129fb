/** The part of `web-push` (3.6.x, untyped) and `http_ece` (the encryption it uses) we use. */
declare module "web-push" {
  export interface PushSubscription {
    readonly endpoint: string
    readonly keys: { readonly p256dh: string; readonly auth: string }
  }
  export interface VapidDetails {
    readonly subject: string
    readonly publicKey: string
    readonly privateKey: string
  }
  export interface RequestOptions {
    readonly vapidDetails?: VapidDetails
    readonly TTL?: number
    readonly contentEncoding?: "aes128gcm" | "aesgcm"
    readonly topic?: string
    readonly urgency?: "very-low" | "low" | "normal" | "high"
    readonly headers?: Readonly<Record<string, string>>
  }
  export interface RequestDetails {
    readonly method: string
    readonly headers: Readonly<Record<string, string | number>>
    readonly body: Buffer | null
    readonly endpoint: string
  }
  export function generateVAPIDKeys(): { readonly publicKey: string; readonly privateKey: string }
  export function getVapidHeaders(
    audience: string,
    subject: string,
    publicKey: string,
    privateKey: string,
    contentEncoding: "aes128gcm" | "aesgcm",
    expiration?: number
  ): { readonly Authorization: string; readonly "Crypto-Key"?: string }
  export function generateRequestDetails(
    subscription: PushSubscription,
    payload?: string | Buffer | null,
    options?: RequestOptions
  ): RequestDetails
  export interface SendResult {
    readonly statusCode: number
    readonly body: string
    readonly headers: Readonly<Record<string, string>>
  }
  export function sendNotification(
    subscription: PushSubscription,
    payload?: string | Buffer | null,
    options?: RequestOptions
  ): Promise<SendResult>
  const webpush: {
    generateVAPIDKeys: typeof generateVAPIDKeys
    getVapidHeaders: typeof getVapidHeaders
    generateRequestDetails: typeof generateRequestDetails
    sendNotification: typeof sendNotification
  }
  export default webpush
}

declare module "http_ece" {
  import type { ECDH } from "node:crypto"
  export interface DecryptParams {
    readonly version: "aes128gcm" | "aesgcm"
    readonly privateKey: ECDH
    readonly authSecret: Buffer
    readonly dh?: string
    readonly salt?: string
  }
  export function decrypt(buffer: Buffer, params: DecryptParams): Buffer
  const ece: { decrypt: typeof decrypt }
  export default ece
}
