/**
 * What the health routes of both nodes (`/__heartbeat__`, `/health`) say when storage fails: the
 * store as the operator configured it and the error in one line, never the name of the operation
 * that happened to meet it (`checkTables` told an operator nothing during an outage).
 */
import { failureText, type StorageError } from "../storage/Storage.ts"

/** How a node's health names its store when it is given no name (tests, embedders). */
export const UNNAMED_STORAGE = "storage"

/** `PostgreSQL at db.internal:5432/autopush is unavailable: connect ECONNREFUSED 10.0.0.5:5432`. */
export const storageHealthCause = (storageName: string, error: StorageError): string =>
  `${storageName} is unavailable: ${failureText(error)}`
