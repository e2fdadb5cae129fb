/**
 * A collector of a receipt subscription (`GET /receipts/{id}`) once admitted: receipts as HTTP/2
 * server pushes (RFC 8030 §6.2), as server-sent events, or as one JSON document once there are
 * some (or the wait is over), reading storage once a second while it waits, until its hold ends.
 * A receipt handed out is removed only once it was written to the client (at least once: a client
 * that drops mid-answer gets it again from its next collection): a collection consumes the
 * subscription, it changes no message's status (so it is no event of the fold).
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import type { Http2ServerResponse } from "node:http2"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { ReceiptNotFound } from "../domain/errors.ts"
import type { StorageError } from "../storage/Storage.ts"
import { type MessageStatus, receiptHttpStatus } from "../domain/receipt.ts"
import type { StatusDocument } from "./receiptStatus.ts"

/** How often a waiting `GET` looks for new receipts in storage. */
const RECEIPT_POLL_MS = 1_000
/** Receipts in one JSON answer at most (the sender asks again for the rest). */
const RECEIPTS_PER_ANSWER = 1_000
/** SSE comment lines this often keep proxies from closing a quiet stream. */
const SSE_HEARTBEAT_MS = 15_000

export const notFound = new ReceiptNotFound({ message: "No such receipt subscription, or it has expired" })

/** How a `GET` of a receipt subscription is answered. */
export type Delivery = "push" | "events" | "json"

export const deliveryOf = (req: IncomingMessage): Delivery => {
  const accept = req.headers.accept ?? ""
  if (/text\/event-stream/i.test(accept)) return "events"
  if (/application\/json/i.test(accept)) return "json"
  const stream = (req as { readonly stream?: { readonly pushAllowed?: boolean } }).stream
  return req.httpVersionMajor === 2 && stream?.pushAllowed === true ? "push" : "json"
}

/** `wait=N` of `Prefer` (RFC 7240), in ms. */
export const preferredWaitMs = (prefer: string | ReadonlyArray<string> | undefined): number | undefined => {
  if (typeof prefer !== "string") return undefined
  const match = /(?:^|[,;\s])wait\s*=\s*"?(\d{1,6})"?/i.exec(prefer)
  return match === null ? undefined : Number(match[1]) * 1000
}

/** What a collector reads and writes with. */
interface CollectorParts {
  /** The subscription's receipts now; undefined when it is gone. */
  readonly read: (id: string) => Effect.Effect<ReadonlyArray<MessageStatus> | undefined, StorageError>
  /** Receipts handed out, removed from storage (a failure is logged). */
  readonly handed: (id: string, receipts: ReadonlyArray<MessageStatus>) => Effect.Effect<void>
  readonly document: (status: MessageStatus) => StatusDocument
  /** The path of the push message resources, as a server push promises them. */
  readonly messagePath: string
  /** Counts a collector ended at its longest hold. */
  readonly endedAtMaxHold: () => void
}

type Headers = Readonly<Record<string, string>>

export const makeCollector = (parts: CollectorParts) => {
  const { handed, document } = parts

  /**
   * Receipts this node has answered with (or is answering with) whose removal has not finished,
   * by subscription: left out of its reads, so a sender that asks again at once does not get them
   * twice from this node. (A sender whose next request reaches another node in that moment may:
   * collection is at least once.)
   */
  const removing = new Map<string, Set<string>>()
  /**
   * The reads of each subscription in flight, each with the receipts it leaves out: those being
   * removed as it began and every one marked while it runs. A read that began before a removal
   * finished may see the receipt still stored, so it keeps leaving it out after the removal ended.
   */
  const reading = new Map<string, Set<Set<string>>>()
  const mark = (id: string, receipts: ReadonlyArray<MessageStatus>) => {
    const ids = removing.get(id) ?? new Set<string>()
    for (const receipt of receipts) ids.add(receipt.messageId)
    removing.set(id, ids)
    for (const excluded of reading.get(id) ?? []) for (const receipt of receipts) excluded.add(receipt.messageId)
  }
  const unmark = (id: string, receipts: ReadonlyArray<MessageStatus>) =>
    Effect.sync(() => {
      const ids = removing.get(id)
      if (ids === undefined) return
      for (const receipt of receipts) ids.delete(receipt.messageId)
      if (ids.size === 0) removing.delete(id)
    })
  const read = (id: string) =>
    Effect.suspend(() => {
      const excluded = new Set(removing.get(id))
      const reads = reading.get(id) ?? new Set<Set<string>>()
      reads.add(excluded)
      reading.set(id, reads)
      return parts.read(id).pipe(
        Effect.map((all) => (all === undefined || excluded.size === 0 ? all : all.filter((receipt) => !excluded.has(receipt.messageId)))),
        Effect.ensuring(Effect.sync(() => {
          reads.delete(excluded)
          if (reads.size === 0 && reading.get(id) === reads) reading.delete(id)
        }))
      )
    })
  const left = (until: number) => Effect.map(Clock.currentTimeMillis, (now) => Math.max(0, until - now))

  /** One JSON answer: the receipts there are, or, once some come (or the wait is over), those. */
  const answerJson = (id: string, first: ReadonlyArray<MessageStatus>, res: ServerResponse, headers: Headers, until: number) =>
    Effect.gen(function*() {
      let all = first
      for (let wait = yield* left(until); all.length === 0 && wait > 0; wait = yield* left(until)) {
        yield* Effect.sleep(Math.min(RECEIPT_POLL_MS, wait))
        const next = yield* read(id)
        if (next === undefined) return yield* notFound
        all = next
      }
      const receipts = all.slice(0, RECEIPTS_PER_ANSWER)
      const body = JSON.stringify({ receipts: receipts.map(document) })
      // Removed once the whole answer went out (and then whatever follows: the removal is not cut by
      // the client closing its socket). A client that dropped mid-answer keeps them for its next
      // collection; meanwhile they are left out of this node's reads (`removing`).
      mark(id, receipts)
      yield* Effect.uninterruptibleMask((restore) =>
        restore(written(res, 200, { ...headers, "content-type": "application/json", "cache-control": "no-store" }, body)).pipe(
          Effect.flatMap((sent) => (sent && receipts.length > 0 ? handed(id, receipts) : Effect.void)),
          Effect.ensuring(unmark(id, receipts))
        ))
    })

  /** Receipts as they come, held open until the client leaves, the subscription expires, the hold is over or the server stops. */
  const stream = (id: string, first: ReadonlyArray<MessageStatus>, delivery: "events" | "push", res: ServerResponse, headers: Headers, until: number) =>
    Effect.gen(function*() {
      if (delivery === "events") {
        res.writeHead(200, { ...headers, "content-type": "text/event-stream", "cache-control": "no-store" })
        res.flushHeaders()
      }
      // A receipt is removed once it went out (one the client refused stays for the next try).
      const send = (receipts: ReadonlyArray<MessageStatus>) =>
        Effect.forEach(receipts, (receipt) =>
          (delivery === "events" ? sentEvent(res, receipt, document) : pushed(res, receipt, document, parts.messagePath)).pipe(
            Effect.flatMap((sent) => (sent ? handed(id, [receipt]) : Effect.void))
          ), { discard: true })
      let receipts: ReadonlyArray<MessageStatus> | undefined = first
      let quiet = 0
      while (receipts !== undefined) {
        yield* send(receipts)
        const wait = yield* left(until)
        if (wait <= 0) break
        const pause = Math.min(RECEIPT_POLL_MS, wait)
        yield* Effect.sleep(pause)
        quiet = receipts.length > 0 ? 0 : quiet + pause
        if (delivery === "events" && quiet >= SSE_HEARTBEAT_MS) {
          quiet = 0
          res.write(": keepalive\n\n")
        }
        receipts = yield* read(id)
      }
      if (receipts !== undefined) {
        // The longest hold is over: ended as when the server stops (the client asks again).
        parts.endedAtMaxHold()
        if (delivery === "events") res.end()
        else yield* written(res, 204, headers, "")
      } else if (delivery === "events") res.end("event: gone\ndata: {}\n\n")
      else yield* written(res, 204, headers, "")
    })

  /** A collector within the caps, held until `until` (ms) at most. Fails only before anything is written. */
  const held = (id: string, delivery: Delivery, res: ServerResponse, headers: Headers, until: number) =>
    Effect.flatMap(read(id), (first) =>
      first === undefined ? Effect.fail(notFound)
      : delivery === "json" ? answerJson(id, first, res, headers, until)
      : stream(id, first, delivery, res, headers, until))

  return { held }
}

/** One receipt as an event: its id is the message's, its data the status document. */
const sentEvent = (res: ServerResponse, receipt: MessageStatus, document: CollectorParts["document"]) =>
  Effect.callback<boolean>((resume) => {
    res.write(`id: ${receipt.messageId}\nevent: receipt\ndata: ${JSON.stringify(document(receipt))}\n\n`, (error) =>
      resume(Effect.succeed(error == null)))
  })

/**
 * One receipt as an HTTP/2 server push: a promised `GET` of the push message resource (under
 * `messagePath`), answered with its status (410 for an acknowledged message) and the status document.
 */
const pushed = (res: ServerResponse, receipt: MessageStatus, document: CollectorParts["document"], messagePath: string) =>
  Effect.callback<boolean>((resume) => {
    ;(res as unknown as Http2ServerResponse).createPushResponse({ ":method": "GET", ":path": messagePath + receipt.messageId }, (error, pushRes) => {
      if (error !== null) return resume(Effect.succeed(false))
      const body = JSON.stringify(document(receipt))
      pushRes.writeHead(receiptHttpStatus(receipt.outcome ?? "acknowledged"), { "content-type": "application/json" })
      pushRes.end(body, () => resume(Effect.succeed(true)))
    })
  })

/** Write a whole answer: true once all of it is handed to the connection, false when the connection closed first. */
const written = (res: ServerResponse, status: number, headers: Headers, body: string) =>
  Effect.callback<boolean>((resume) => {
    const closed = () => resume(Effect.succeed(false))
    res.once("close", closed)
    res.writeHead(status, body === "" ? headers : { ...headers, "content-length": String(Buffer.byteLength(body)) })
    // Called on `finish`, or with an error when the stream was destroyed first.
    res.end(body, (error?: Error | null) => {
      res.off("close", closed)
      resume(Effect.succeed(error == null))
    })
  })
