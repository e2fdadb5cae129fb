/**
 * CORS on every endpoint answer: any origin and header, DELETE/GET/POST/PUT, preflights cached 1 h,
 * `Location`, `TTL` and `Link` readable (a push from a web page reads where its message went).
 */
import * as HttpMiddleware from "effect/http/HttpMiddleware"

const CORS = { allowedMethods: ["DELETE", "GET", "POST", "PUT"], exposedHeaders: ["location", "ttl", "link", "autopush-warning"], maxAge: 3600 }

/** The platform's routes with CORS. */
export const endpointCors = HttpMiddleware.cors(CORS)

/** What `endpointCors` adds to the answer of a request that is not a preflight: for the routes in front of it. */
export const CORS_HEADERS: Readonly<Record<string, string>> = {
  "access-control-allow-origin": "*",
  "access-control-expose-headers": CORS.exposedHeaders.join(",")
}
