/**
 * `GET /errors`: the service's own reference of the errors it answers — the README's "Errors"
 * section (every status, errno, message, meaning and what to do), as a small HTML page. The error
 * JSON's `more_info` points here. Read once at start from the README beside the service; a copy
 * without it serves a page that says where the table is.
 */
import { readFileSync } from "node:fs"
import * as HttpServerResponse from "effect/http/HttpServerResponse"

const README = new URL("../../README.md", import.meta.url)

const escape = (text: string): string =>
  text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;")

/** Inline markdown of the table cells and paragraphs: code spans and links (as text). */
const inline = (text: string): string =>
  escape(text).replace(/`([^`]+)`/g, "<code>$1</code>").replace(/\[([^\]]+)\]\([^)]*\)/g, "$1")

const cells = (row: string): Array<string> => row.trim().replace(/^\||\|$/g, "").split("|").map((cell) => cell.trim())

/** The lines of `## Errors` up to the next `## ` heading, as HTML (headings, tables, paragraphs). */
const renderErrors = (markdown: string): string | undefined => {
  const lines = markdown.split("\n")
  const start = lines.findIndex((line) => line.trim() === "## Errors")
  if (start < 0) return undefined
  const end = lines.findIndex((line, i) => i > start && line.startsWith("## "))
  const html: Array<string> = []
  let paragraph: Array<string> = []
  let table: Array<string> = []
  const flush = () => {
    if (paragraph.length > 0) html.push(`<p>${inline(paragraph.join(" "))}</p>`)
    paragraph = []
    if (table.length > 0) {
      const [head = "", , ...rows] = table
      html.push(
        `<table><thead><tr>${cells(head).map((c) => `<th>${inline(c)}</th>`).join("")}</tr></thead><tbody>`,
        ...rows.map((row) => `<tr>${cells(row).map((c) => `<td>${inline(c)}</td>`).join("")}</tr>`),
        "</tbody></table>"
      )
    }
    table = []
  }
  for (const line of lines.slice(start + 1, end < 0 ? undefined : end)) {
    if (line.startsWith("### ")) {
      flush()
      html.push(`<h2>${inline(line.slice(4))}</h2>`)
    } else if (line.trim().startsWith("|")) {
      if (paragraph.length > 0) flush()
      table.push(line)
    } else if (line.trim() === "") flush()
    else paragraph.push(line.trim())
  }
  flush()
  return html.join("\n")
}

const page = (body: string): string =>
  `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Errors — autopush-ts</title>` +
  `<meta name="viewport" content="width=device-width, initial-scale=1">` +
  `<style>body{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:72rem;padding:0 1rem}` +
  `table{border-collapse:collapse;width:100%;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .5rem;vertical-align:top;text-align:left}` +
  `code{font-size:90%;overflow-wrap:anywhere}</style></head><body><h1>Errors</h1>\n${body}\n</body></html>`

/** The page, made once. */
export const makeErrorsPage = (): HttpServerResponse.HttpServerResponse => {
  let rendered: string | undefined
  try {
    rendered = renderErrors(readFileSync(README, "utf8"))
  } catch {
    rendered = undefined
  }
  const body = rendered ?? "<p>This copy of the service was installed without its README.md, whose \"Errors\" section lists every error.</p>"
  return HttpServerResponse.text(page(body), {
    contentType: "text/html; charset=utf-8",
    headers: { "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'", "cache-control": "max-age=3600" }
  })
}
