/** Types of webpush.js (served to the page as it is; tests import it in Node). */
export interface PageSubscriberKeys {
  readonly privateKey: CryptoKey
  readonly publicRaw: Uint8Array
  readonly auth: Uint8Array
  readonly p256dh: string
  readonly authText: string
}
export interface PageVapidKeys {
  readonly privateKey: CryptoKey
  readonly publicKey: string
}
export declare const makeSubscriberKeys: () => Promise<PageSubscriberKeys>
export declare const maxPlaintextBytes: (maxBodyBytes: number) => number
export declare const encryptAes128gcm: (keys: { readonly p256dh: string; readonly auth: string }, plaintext: Uint8Array) => Promise<Uint8Array>
export declare const sendPush: (
  subscription: { readonly endpoint: string; readonly keys: { readonly p256dh: string; readonly auth: string } },
  plaintext: Uint8Array,
  headers: Readonly<Record<string, string>>
) => Promise<{ readonly response: Response; readonly problem: string | undefined }>
export declare const decryptPush: (
  keys: Pick<PageSubscriberKeys, "privateKey" | "publicRaw" | "auth">,
  data: string,
  headers: { readonly encoding?: string; readonly crypto_key?: string; readonly encryption?: string }
) => Promise<Uint8Array>
export declare const makeVapidKeys: () => Promise<PageVapidKeys>
export declare const vapidAuthorization: (vapid: PageVapidKeys, endpoint: string, subject: string) => Promise<string>
export declare const CONSOLE_VAPID_SUBJECT: string
