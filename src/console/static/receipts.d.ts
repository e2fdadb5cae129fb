/** Types of receipts.js (served to the page as it is; the push command line imports it in Node). */

/** A push message's status document, as a receipt or `GET /m/{id}` gives it (times in ms since the epoch). */
export interface StatusDocument {
  readonly message: string
  readonly state: string
  readonly status?: number
  readonly acceptedAt?: number
  readonly deadline?: number
  readonly storedAt?: number
  readonly deliveredAt?: number
  readonly outcome?: string
  readonly outcomeAt?: number
  readonly code?: number
}

export declare const FINAL_STATES: ReadonlyArray<string>
export declare const isFinal: (status: Pick<StatusDocument, "state">) => boolean
export declare const createReceiptSubscription: (
  endpoint: string
) => Promise<{ readonly subscription: string; readonly problem: undefined } | { readonly subscription: undefined; readonly problem: string }>
export declare const receiptHeaders: (subscription: string) => { readonly "Push-Receipt": string; readonly Prefer: string }
export declare const describeSteps: (status: Omit<StatusDocument, "message" | "state">) => string
export declare const describeStatus: (status: Omit<StatusDocument, "message">) => string
