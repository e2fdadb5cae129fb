/** The part of `web-push` (3.6.x, untyped) the endpoint tests use. */
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
  const webpush: {
    generateVAPIDKeys: typeof generateVAPIDKeys
    getVapidHeaders: typeof getVapidHeaders
    generateRequestDetails: typeof generateRequestDetails
  }
  export default webpush
}
