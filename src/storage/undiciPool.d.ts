/**
 * undici's connection pool and its `request`, on their own: the package's index loads all of undici
 * (fetch, WebSocket, caches, mocks: about 30 ms more at start-up) and only then gives its
 * dispatchers their `request` method; the storage client needs these two modules (the version is
 * pinned in package.json).
 */
declare module "undici/lib/dispatcher/pool.js" {
  import type { Pool } from "undici"

  const PoolClass: typeof Pool
  export default PoolClass
}

declare module "undici/lib/api/api-request.js" {
  import type { Dispatcher } from "undici"

  /** `dispatcher.request(options)` of the package's index, called with the dispatcher as `this`. */
  const request: (this: Dispatcher, options: Dispatcher.RequestOptions) => Promise<Dispatcher.ResponseData>
  export default request
}
