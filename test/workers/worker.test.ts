/** What a node run as several workers gives each one: its private port, its flags, and what is refused. */
import { assert, describe, it } from "vitest"
import { makeSettings } from "../../src/config/index.ts"
import { workersRefusal } from "../../src/workers/supervisor.ts"
import { workerContextOf, workerFlags, workerPorts } from "../../src/workers/worker.ts"

describe("workerPorts", () => {
  it("the router port and the next ones up, skipping the node's public ports (all-in-one defaults: 8082 is endpoint_port)", () => {
    assert.deepStrictEqual(workerPorts("autopush", makeSettings(), 3), [8081, 8083, 8084])
  })
  it("a connection node skips only its WebSocket port", () => {
    assert.deepStrictEqual(workerPorts("autoconnect", makeSettings({ port: 8082 }), 3), [8081, 8083, 8084])
    assert.deepStrictEqual(workerPorts("autoconnect", makeSettings(), 2), [8081, 8082])
  })
  it("an endpoint node's workers have metrics ports, skipping endpoint_port", () => {
    assert.deepStrictEqual(workerPorts("autoendpoint", makeSettings({ metrics_port: 8082, endpoint_port: 8083 }), 2), [8082, 8084])
  })
})

describe("workerFlags", () => {
  it("a connection worker: its router port and its share of max_connections (rounded up)", () => {
    assert.deepStrictEqual(workerFlags("autoconnect", makeSettings({ max_connections: 100_000 }), 2, 3), ["--router-port", "8083", "--max-connections", "33334"])
  })
  it("an endpoint worker: its metrics port", () => {
    assert.deepStrictEqual(workerFlags("autoendpoint", makeSettings(), 1, 2), ["--metrics-port", "8084"])
  })
})

describe("workersRefusal", () => {
  it("one worker is always fine", () => {
    assert.isUndefined(workersRefusal("autopush", makeSettings({ router_url: "http://10.0.0.1:9000" }), 1))
  })
  it("an explicit router_url cannot name several workers; one built from router_hostname can", () => {
    assert.match(workersRefusal("autoconnect", makeSettings({ router_url: "http://10.0.0.1:9000" }), 2) ?? "", /unset router_url and set router_hostname/)
    assert.isUndefined(workersRefusal("autoconnect", makeSettings({ router_hostname: "10.0.0.1" }), 2))
  })
  it("ports past 65535 are refused, naming the option", () => {
    assert.match(workersRefusal("autoconnect", makeSettings({ router_port: 65_535 }), 2) ?? "", /past 65535: choose a lower router_port/)
  })
})

describe("workerContextOf", () => {
  it("reads the context a supervisor gives its workers; no variable, no worker", () => {
    assert.deepStrictEqual(workerContextOf({ AUTOPUSH_WORKER: JSON.stringify({ index: 1, count: 2, storageEndpoint: "http://127.0.0.1:1" }) }), {
      index: 1,
      count: 2,
      storageEndpoint: "http://127.0.0.1:1"
    })
    assert.isUndefined(workerContextOf({}))
  })
})
