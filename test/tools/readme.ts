/** The README's tables, read at test time, so that tests check the code against what users are told. */
import { readFileSync } from "node:fs"

export const readme = (): string => readFileSync(new URL("../../README.md", import.meta.url), "utf8")

/** The rows of the README table whose header line starts with `header`, as arrays of trimmed cells. */
export const readmeTable = (header: string): Array<Array<string>> => {
  const text = readme()
  const start = text.indexOf(header)
  if (start === -1) throw new Error(`README.md has no table headed ${JSON.stringify(header)}`)
  const rows: Array<Array<string>> = []
  for (const line of text.slice(start).split("\n").slice(2)) {
    if (!line.startsWith("|")) break
    rows.push(line.split("|").slice(1, -1).map((cell) => cell.trim()))
  }
  return rows
}
