/**
 * The Grafana dashboard (deploy/grafana-dashboard.json) and the Prometheus alert rules
 * (deploy/prometheus-alerts.yml) query only what the service exposes:
 * every metric name in its PromQL is a series of the Prometheus text the service renders (each
 * catalog metric recorded once, with its tags), and every label it groups or filters by is one of
 * that metric's labels.
 */
import { assert, describe, it } from "@effect/vitest"
import { readFileSync } from "node:fs"
import { parse as parseYaml } from "yaml"
import { METRICS } from "../../src/observability/catalog.ts"
import { makeMetrics } from "../../src/observability/Metrics.ts"

const dashboard = JSON.parse(readFileSync(new URL("../../deploy/grafana-dashboard.json", import.meta.url), "utf8")) as {
  readonly panels: ReadonlyArray<{ readonly title: string; readonly targets?: ReadonlyArray<{ readonly expr: string }> }>
}

/** Every series name and its label names, as `/metrics` shows them once every metric has been touched. */
const exposed = (): ReadonlyMap<string, ReadonlySet<string>> => {
  const metrics = makeMetrics()
  for (const info of Object.values(METRICS)) {
    const tags = Object.fromEntries(Object.keys(info.tags).map((tag) => [tag, "x"]))
    if (info.kind === "counter") metrics.counter(info.name, tags).inc()
    else if (info.kind === "gauge") metrics.gauge(info.name, tags).set(1)
    else metrics.timer(info.name, tags).record(1)
  }
  const series = new Map<string, Set<string>>()
  for (const line of metrics.prometheus().split("\n")) {
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? /.exec(line)
    if (match === null) continue
    const labels = series.get(match[1]!) ?? new Set<string>()
    for (const [, label] of (match[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)) labels.add(label!)
    series.set(match[1]!, labels)
  }
  return series
}

const KEYWORDS = new Set(["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"])

/** The metric names and the labels (in `by (…)` and `{…}`) of a PromQL expression. */
const parse = (expr: string) => {
  const labels = new Set<string>()
  for (const [, list] of expr.matchAll(/\b(?:by|without)\s*\(([^)]*)\)/g)) for (const l of list!.split(",")) labels.add(l.trim())
  for (const [, matchers] of expr.matchAll(/\{([^}]*)\}/g)) for (const [, l] of matchers!.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=|!=|=~|!~)/g)) labels.add(l!)
  const bare = expr
    .replace(/\b(?:by|without)\s*\([^)]*\)/g, " ")
    .replace(/\{[^}]*\}/g, " ")
    .replace(/\[[^\]]*\]/g, " ")
    .replace(/\boffset\s+\w+/g, " ")
    .replace(/"[^"]*"/g, " ")
  const names = [...bare.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?/g)]
    .filter(([name, , call]) => call === undefined && !KEYWORDS.has(name!.toLowerCase()) && !/^\d/.test(name!))
    .map(([name]) => name!)
  labels.delete("")
  return { names, labels }
}

describe("Grafana dashboard", () => {
  it("every metric it queries is exposed, with the labels it uses", () => {
    const series = exposed()
    const queried = new Set<string>()
    const targets = dashboard.panels.flatMap((panel) => (panel.targets ?? []).map((target) => ({ panel: panel.title, expr: target.expr })))
    assert.isAbove(targets.length, 10)
    for (const { panel, expr } of targets) {
      const { names, labels } = parse(expr)
      assert.isNotEmpty(names, `${panel}: ${expr} queries no metric`)
      for (const name of names) {
        queried.add(name)
        assert.isTrue(series.has(name), `${panel}: ${name} is not exposed (${expr})`)
        for (const label of labels) {
          assert.isTrue(label === "le" ? name.endsWith("_bucket") : series.get(name)!.has(label), `${panel}: ${name} has no label ${label}`)
        }
      }
    }
    // The dashboard covers the catalog: each metric family appears in some panel.
    const families = Object.values(METRICS).map((info) => info.name.replace(/[^a-zA-Z0-9_:]/g, "_"))
    for (const family of families) {
      assert.isTrue([...queried].some((name) => name.startsWith(family)), `no panel shows ${family}`)
    }
  })

  it("the Prometheus alert rules query exposed metrics and labels, each rule named and explained", () => {
    const rules = parseYaml(readFileSync(new URL("../../deploy/prometheus-alerts.yml", import.meta.url), "utf8")) as {
      readonly groups: ReadonlyArray<{ readonly rules: ReadonlyArray<{ alert: string; expr: string; annotations?: { summary?: string; description?: string } }> }>
    }
    const series = exposed()
    const all = rules.groups.flatMap((group) => group.rules)
    assert.isAtLeast(all.length, 5)
    for (const rule of all) {
      assert.match(rule.alert, /^Autopush[A-Za-z]+$/)
      assert.isNotEmpty(rule.annotations?.summary ?? "", rule.alert)
      assert.isNotEmpty(rule.annotations?.description ?? "", rule.alert)
      const { names, labels } = parse(rule.expr)
      assert.isNotEmpty(names, `${rule.alert} queries no metric`)
      for (const name of names) {
        assert.isTrue(series.has(name), `${rule.alert}: ${name} is not exposed (${rule.expr})`)
        for (const label of labels) assert.isTrue(series.get(name)!.has(label), `${rule.alert}: ${name} has no label ${label}`)
      }
    }
  })

  it("the parser finds names and labels (so the check above can fail)", () => {
    const parsed = parse(`histogram_quantile(0.99, sum by (le, operation) (rate(storage_time_milliseconds_bucket{outcome="error"}[5m])))`)
    assert.deepStrictEqual(parsed.names, ["storage_time_milliseconds_bucket"])
    assert.deepStrictEqual([...parsed.labels].sort(), ["le", "operation", "outcome"])
    assert.isFalse(exposed().has("ua_connections_total"))
  })
})
