/** Types of checks.js (served to the page as it is; tests import it in Node). */
export interface PageContext {
  readonly isSecureContext?: boolean
  readonly crypto?: { readonly subtle?: unknown }
  readonly location: { readonly href: string }
}
export declare const pageProblem: (page: PageContext, websocketUrl: string | undefined) => string | undefined
export declare const subscribeProblem: (error: unknown) => string
