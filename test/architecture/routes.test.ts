/**
 * Every route has a row in the README's route table ("Work per route": its input bound, its
 * fan-out bound and the limit before parsing), and every row names a route that exists. The routes
 * are read from the code that registers them:
 *
 * - the endpoint port: each `resource(path, { METHOD: … })` of `src/endpoint/routes.ts` (a resource
 *   without handlers, answered in front, by its path), the Matrix gateway's `NOTIFY_PATH`, the
 *   console's `HttpRouter.route(method, path, …)`;
 * - the connection node's ports: the health paths of `handleHealth` (both ports), the router port's
 *   routes by their first segment (`routeLabel` of `src/connection/http.ts`), the metrics listener's path;
 * - the WebSocket commands: the message types `decodeClientMessage` knows (`src/protocol/messages.ts`).
 *
 * So a route added without its row (or a row left for a route removed) fails here.
 */
import { readFileSync } from "node:fs"
import { resolve } from "node:path"
import { assert, describe, it } from "@effect/vitest"

const ROOT = resolve(import.meta.dirname, "../..")
const read = (path: string): string => readFileSync(resolve(ROOT, path), "utf8")

/** A route as the code has it: a port, a path with `{param}`s, and its methods (empty: any). */
interface Route {
  readonly port: string
  readonly path: string
  readonly methods: ReadonlyArray<string>
}

const braces = (path: string): string => path.replace(/:(\w+)/g, "{$1}")

/** A path as compared: its parameters' names left out (the README may name them for readers). */
const shape = (path: string): string => path.replace(/\{\w+\}/g, "{}")

/** The endpoint port's routes: `routes.ts`, the Matrix gateway, the console. */
const endpointRoutes = (): ReadonlyArray<Route> => {
  const source = read("src/endpoint/routes.ts")
  const consts = new Map([...source.matchAll(/const (\w+) = "([^"]+)"/g)].map(([, name, value]) => [name as string, value as string]))
  const routes: Array<Route> = []
  for (const [, quoted, rawPath, handlers] of source.matchAll(/resource\((["`]?)(.+?)\1, \{([^}]*)\}/g)) {
    const written = quoted === "" ? consts.get(rawPath as string) ?? `?${rawPath}` : (rawPath as string)
    const path = written.replace(/\$\{(\w+)\}/g, (_, name: string) => consts.get(name) ?? `?${name}`)
    routes.push({ port: "endpoint", path: braces(path), methods: [...(handlers as string).matchAll(/\b([A-Z]+):/g)].map(([, m]) => m as string) })
  }
  const notify = /NOTIFY_PATH = "([^"]+)"/.exec(read("src/gateway/matrixRequest.ts"))?.[1]
  if (notify !== undefined) routes.push({ port: "endpoint", path: notify, methods: ["POST", "GET"] })
  for (const [, method, path] of read("src/console/console.ts").matchAll(/HttpRouter\.route\("(\w+)", "([^"]+)"/g)) {
    routes.push({ port: "endpoint", path: path as string, methods: [method as string] })
  }
  return routes
}

/** The connection node's ports: health on both, the router API and operators' routes, the metrics listener. */
const connectionRoutes = (): ReadonlyArray<Route> => {
  const source = read("src/connection/http.ts")
  const health = /const handleHealth[\s\S]*?\n}\n/.exec(source)?.[0] ?? ""
  const routes: Array<Route> = []
  for (const [, path] of health.matchAll(/case "(\/[^"]*)":/g)) {
    routes.push({ port: "connection", path: path as string, methods: ["GET"] }, { port: "router", path: path as string, methods: ["GET"] })
  }
  const firstSegments = /\[("push"[^\]]*)\]/.exec(source)?.[1] ?? ""
  for (const [, segment] of firstSegments.matchAll(/"(\w+)"/g)) {
    if (!routes.some((r) => r.path === `/${segment}`)) routes.push({ port: "router", path: `/${segment}/*`, methods: [] })
  }
  const metrics = /path !== "(\/\w+)"/.exec(read("src/observability/metricsListener.ts"))?.[1]
  if (metrics !== undefined) routes.push({ port: "metrics", path: metrics, methods: ["GET"] })
  return routes
}

/** The WebSocket commands a client may send. */
const websocketCommands = (): ReadonlyArray<Route> => {
  const source = read("src/protocol/messages.ts")
  const bodies = /const bodies = \{([\s\S]*?)\} as const/.exec(source)?.[1] ?? ""
  const types = [...bodies.matchAll(/^\s*(\w+): \w/gm)].map(([, name]) => name as string)
  if (/messageType: "ping"/.test(source)) types.push("ping")
  return types.map((type) => ({ port: "WebSocket", path: type, methods: [] }))
}

/** A row of the route table: its ports, and each route it names (`METHOD… /path`, or a WebSocket command). */
interface Row {
  readonly ports: ReadonlyArray<string>
  readonly routes: ReadonlyArray<{ readonly methods: ReadonlyArray<string>; readonly path: string }>
  readonly cells: ReadonlyArray<string>
}

const routeTable = (): ReadonlyArray<Row> => {
  const readme = read("README.md")
  const at = readme.indexOf("#### Work per route")
  assert.isAtLeast(at, 0, "the README has a route table under \"#### Work per route\"")
  const lines = readme.slice(at).split("\n")
  const start = lines.findIndex((line) => line.startsWith("| port |"))
  const rows: Array<Row> = []
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith("|")) break
    const cells = line.split("|").slice(1, -1).map((cell) => cell.trim())
    const ports = (cells[0] ?? "").split(",").map((port) => port.trim())
    const routes = [...(cells[1] ?? "").matchAll(/`([^`]+)`/g)].map(([, text]) => {
      const words = (text as string).split(" ")
      return { methods: words.slice(0, -1), path: words.at(-1) as string }
    })
    rows.push({ ports, routes, cells })
  }
  return rows
}

/** Whether a row's route names `route`: the same path (a router route by its first segment), and its methods. */
const names = (row: Row, route: Route): boolean =>
  row.ports.includes(route.port) && row.routes.some((named) => {
    const samePath = route.path.endsWith("/*") ? named.path.startsWith(route.path.slice(0, -1)) || named.path === route.path.slice(0, -2) : shape(named.path) === shape(route.path)
    return samePath && route.methods.every((method) => named.methods.length === 0 || named.methods.includes(method))
  })

describe("the route table", () => {
  // One entry per method, so that a path's methods may have rows of their own.
  const code = [...endpointRoutes(), ...connectionRoutes(), ...websocketCommands()].flatMap((route) =>
    route.methods.length === 0 ? [route] : route.methods.map((method) => ({ ...route, methods: [method] })))
  const rows = routeTable()

  it("is read from the code: the routes of every port and the WebSocket commands are found", () => {
    for (const port of ["endpoint", "connection", "router", "metrics", "WebSocket"]) {
      assert.isAbove(code.filter((route) => route.port === port).length, 0, port)
    }
    assert.isAtLeast(code.filter((route) => route.port === "endpoint").length, 20)
    assert.includeMembers(code.filter((r) => r.port === "WebSocket").map((r) => r.path), ["hello", "register", "ack", "ping"])
  })

  it("has a row for every route, with its input bound, fan-out bound and limit", () => {
    const missing = code.filter((route) => !rows.some((row) => names(row, route))).map((r) => `${r.port} ${r.methods.join(" ")} ${r.path}`)
    assert.deepStrictEqual(missing, [], "routes without a row in README.md's \"Work per route\" table")
    for (const row of rows) {
      assert.strictEqual(row.cells.length, 5, row.cells.join(" | "))
      for (const cell of row.cells) assert.isAbove(cell.length, 0, `an empty cell: ${row.cells.join(" | ")}`)
    }
  })

  it("names no route that does not exist", () => {
    const stale = rows.flatMap((row) =>
      row.routes.flatMap((named) =>
        row.ports
          .filter((port) => !code.some((route) => route.port === port && names({ ...row, ports: [port], routes: [named] }, route)))
          .map((port) => `${port} ${named.methods.join(" ")} ${named.path}`)
      )
    )
    assert.deepStrictEqual(stale, [])
  })
})
