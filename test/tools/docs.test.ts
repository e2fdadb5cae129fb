/** The operator docs stay true to the code: the configuration table, the IAM actions, the tool commands. */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { optionNames } from "../../src/config/options.ts"
import { configurationMarkdown } from "../../src/config/write-docs.ts"
import { COMMANDS } from "../../src/tools/maintenance.ts"

const root = new URL("../../", import.meta.url).pathname
const read = (path: string): string => readFileSync(join(root, path), "utf8")

describe("docs", () => {
  it("docs/configuration.md is the generator's output (run `npm run docs:config` after changing an option)", () => {
    const markdown = configurationMarkdown()
    for (const name of optionNames) expect(markdown).toContain(`| \`${name}\` |`)
    expect(read("docs/configuration.md")).toBe(markdown)
  })

  it("docs/aws.md names exactly the DynamoDB actions the storage layer calls", () => {
    const source = read("src/storage/dynamodb.ts")
    const called = new Set([...source.matchAll(/new (\w+)Command\(/g)].map((m) => `dynamodb:${m[1]}`))
    expect(called.size).toBeGreaterThan(5)
    const aws = read("docs/aws.md")
    const documented = new Set([...aws.matchAll(/\bdynamodb:([A-Z][a-z]\w*)/g)].map((m) => `dynamodb:${m[1]}`))
    expect([...documented].sort()).toEqual([...called].sort())
    // The policies are valid JSON and together allow every action.
    const policies = [...aws.matchAll(/```json\n([\s\S]*?)```/g)].map((m) => JSON.parse(m[1] ?? "") as {
      Statement: Array<{ Action: Array<string> }>
    })
    expect(policies.length).toBe(2)
    const allowed = new Set(policies.flatMap((p) => p.Statement.flatMap((s) => s.Action)))
    expect([...allowed].sort()).toEqual([...called].sort())
  })

  it("docs/tools.md covers every maintenance command and its flags", () => {
    const tools = read("docs/tools.md")
    for (const [name, command] of Object.entries(COMMANDS)) {
      expect(tools).toContain(`### ${name}`)
      for (const [flag] of command.flags) expect(tools).toContain(flag.split(" ")[0])
    }
  })
})
