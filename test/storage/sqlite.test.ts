/** The contract against the SQLite store, every layer of this file on one database file (each its own connection). */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll } from "vitest"
import { layerSqlite } from "../../src/storage/sqlite.ts"
import { storageContract } from "./contract.ts"

const dir = mkdtempSync(join(tmpdir(), "autopush-sqlite-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

storageContract("sqlite", (options) => layerSqlite({ ...options, path: join(dir, "autopush.sqlite") }))
