/** The operator docs stay true to the code: the configuration table, the IAM actions, the tool commands. */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { optionNames, options } from "../../src/config/options.ts"
import { configurationMarkdown } from "../../src/config/write-docs.ts"
import { errorAnswers } from "../../src/domain/errors.ts"
import { closeFrames } from "../../src/protocol/close.ts"
import { COMMANDS } from "../../src/tools/maintenance.ts"
import { readme, readmeTable } from "./readme.ts"

const root = new URL("../../", import.meta.url).pathname
const read = (path: string): string => readFileSync(join(root, path), "utf8")

describe("docs", () => {
  it("docs/configuration.md is the generator's output (run `npm run docs:config` after changing an option)", () => {
    const markdown = configurationMarkdown()
    for (const name of optionNames) expect(markdown).toContain(`| \`${name}\` |`)
    expect(read("docs/configuration.md")).toBe(markdown)
  })

  it("docs/aws.md names exactly the DynamoDB actions the storage layer calls", () => {
    const source = ["dynamo/layer.ts", "dynamo/requests.ts", "dynamo/maintenance.ts", "dynamo/export.ts", "dynamo/receipts.ts"].map((file) => read(`src/storage/${file}`)).join("\n")
    const called = new Set([...source.matchAll(/client\.send\(\s*"(\w+)"/g)].map((m) => `dynamodb:${m[1]}`))
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

  it("the README's error table lists every status and errno the API answers", () => {
    const rows = readmeTable("| status | errno | message")
    const listed = (status: number, errno: number | null) =>
      rows.some(([s, e]) => (s ?? "").split(" / ").includes(String(status)) && e === String(errno))
    const missing = errorAnswers.filter(({ status, errno }) => !listed(status, errno))
    expect(missing).toEqual([])
  })

  it("the README's close table lists every close code the connection node sends, and the WebSocket library's own", () => {
    const rows = readmeTable("| close code | reason | when |")
    const listed = (code: number, reason: string) =>
      rows.some(([c, r]) => c === String(code) && (reason === "" ? r === "—" : (r ?? "").includes(`\`${reason}\``)))
    // ws closes by itself: 1002 protocol violations, 1007 invalid UTF-8, 1009 over max_message_size.
    const library = [1002, 1007, 1009].map((code) => ({ code, reason: "" }))
    const missing = [...closeFrames, ...library].filter(({ code, reason }) => !listed(code, reason))
    expect(missing).toEqual([])
  })

  it("the README's shell examples pass no secret as a flag (ps shows it, npm prints it), and no crypto key as the auth key", () => {
    const secretFlags = optionNames.filter((name) => options[name].secret).map((name) => `--${name.replaceAll("_", "-")}`)
    expect(secretFlags).toContain("--auth-keys")
    const shell = [...readme().matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1] ?? "").join("\n")
    expect(shell).toContain("npm run autoendpoint")
    expect(secretFlags.filter((flag) => new RegExp(`${flag}(?![\\w-])`).test(shell))).toEqual([])
    expect(shell).not.toMatch(/AUTH_KEYS(_FILE)?=\S*CRYPTO_KEY/)
  })

  it("the README's limits table names every limit option", () => {
    const rows = readmeTable("| option | default | beyond it |")
    for (const name of ["max_connections", "max_message_size", "max_control_frames_per_second", "max_send_buffer", "max_channels_per_user", "client_commands_per_second", "client_command_burst", "msg_limit", "client_request_timeout", "max_in_flight_requests", "max_data_bytes"]) {
      expect(rows.some(([option]) => (option ?? "").includes(`\`${name}\``)), name).toBe(true)
    }
  })
})
