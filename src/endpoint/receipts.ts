/**
 * Push receipts on the endpoint (RFC 8030 §5.1, §6): the receipt subscribe resource
 * (`POST /receipts`), `Push-Receipt` on a push, the receipt subscription (`GET /receipts/{id}`:
 * HTTP/2 server push, a JSON long poll, or server-sent events) and the push message resource's status
 * (`GET /m/{message_id}`).
 *
 * Receipts come from status rows in storage (`storage/dynamoReceipts.ts`), written by whichever
 * node saw the step (this endpoint at accept, a connection node at delivery and ack), so any endpoint
 * node answers for any subscription. Collecting also settles what no node can see happen: a message
 * whose TTL ran out undelivered (expired), a subscription the user agent dropped (unsubscribed).
 *
 * A `GET` of a subscription (a collector) is held while it waits, reading storage once a second, and
 * does not count toward `max_in_flight_requests` (a held GET must not keep pushes out). So collectors
 * have bounds of their own, on this node: per subscription and per client address (429/116 with
 * `Retry-After` beyond), all together (503/201 beyond), and a longest hold, after which a stream
 * ends as when the server stops. Each one also takes a token of the address's rate limit as it starts.
 */
import { randomBytes } from "node:crypto"
import type { IncomingMessage, ServerResponse } from "node:http"
import type { Http2ServerResponse } from "node:http2"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { InvalidReceipt, Overloaded, ReceiptNotFound, StorageUnavailable, TooManyCollectors } from "../domain/errors.ts"
import type { RouteOutcome } from "../domain/events.ts"
import { RecentMap } from "../platform/memo.ts"
import { expiresAt, type Notification } from "../domain/notification.ts"
import { ackOutcome, type MessageState, type MessageStatus, receiptHttpStatus, stateOf } from "../domain/receipt.ts"
import { METRICS } from "../observability/catalog.ts"
import { EventLog } from "../observability/EventLog.ts"
import { Metrics } from "../observability/Metrics.ts"
import { MessageTrace, type TraceDocument, type TraceState } from "../observability/MessageTrace.ts"
import { makeReceiptBook, RECEIPT_RETENTION_SECONDS } from "../receipts/book.ts"
import { Storage, storageUnavailable } from "../storage/Storage.ts"
import { peerOf } from "./http2.ts"
import type { RateLimits } from "./rateLimits.ts"
import { endpointBase, type EndpointOptions } from "./options.ts"

/** The link relation of the receipt subscribe resource (RFC 8030 §5.1). */
const RECEIPT_RELATION = "urn:ietf:params:push:receipt"

/** How often a waiting `GET` looks for new receipts in storage. */
const RECEIPT_POLL_MS = 1_000
/** A message delivered but not acked yet is given this long after its TTL before it counts as expired. */
const ACK_GRACE_MS = 60_000
/** A message without an outcome is checked for its subscription at most this often (per process). */
const SUBSCRIPTION_CHECK_MS = 30_000
/**
 * A use of a subscription (a push naming it, a read) renews it once that adds more than this (s): at
 * most one write an hour per endpoint process, and a subscription lives at least its idle time less
 * this after its last use (an hour less than 7 days; a tenth less when the idle time is shorter).
 */
const RENEW_STEP = (idleSeconds: number): number => Math.min(3600, idleSeconds / 10)
/** Messages checked for their subscription per read of a receipt subscription (each check: two reads). */
const SUBSCRIPTION_CHECKS_PER_READ = 25
/** Receipts in one JSON answer at most (the sender asks again for the rest). */
const RECEIPTS_PER_ANSWER = 1_000
/** SSE comment lines this often keep proxies from closing a quiet stream. */
const SSE_HEARTBEAT_MS = 15_000
/**
 * A collector still busy this long after its longest hold (a storage request or a write to the
 * client that does not finish) is ended anyway: 503/201 if nothing was answered yet, else the
 * stream is cut.
 */
const HOLD_GRACE_MS = 5_000

/** Receipt subscription ids: 16 random bytes, unguessable like endpoint tokens. */
const SUBSCRIPTION_ID = /^[A-Za-z0-9_-]{22}$/

/** `wait=N` of `Prefer` (RFC 7240), in ms. */
const preferredWaitMs = (prefer: string | ReadonlyArray<string> | undefined): number | undefined => {
  if (typeof prefer !== "string") return undefined
  const match = /(?:^|[,;\s])wait\s*=\s*"?(\d{1,6})"?/i.exec(prefer)
  return match === null ? undefined : Number(match[1]) * 1000
}

/** How a `GET` of a receipt subscription is answered. */
type Delivery = "push" | "events" | "json"

const deliveryOf = (req: IncomingMessage): Delivery => {
  const accept = req.headers.accept ?? ""
  if (/text\/event-stream/i.test(accept)) return "events"
  if (/application\/json/i.test(accept)) return "json"
  const stream = (req as { readonly stream?: { readonly pushAllowed?: boolean } }).stream
  return req.httpVersionMajor === 2 && stream?.pushAllowed === true ? "push" : "json"
}

const TRACE_STATES: Readonly<Record<TraceState, MessageState | undefined>> = {
  accepted: "accepted",
  routed: "accepted",
  stored: "stored",
  delivered: "delivered",
  bridged: "bridged",
  nacked: "rejected",
  acked: "acknowledged",
  expired: "expired",
  deleted: "deleted",
  failed: undefined
}

/** The times of a trace's steps, as a status row names them. */
const TRACE_TIMES: Readonly<Record<string, keyof MessageStatus>> = {
  "notification.accepted.1": "acceptedAt",
  "notification.stored.1": "storedAt",
  "notification.delivered.1": "deliveredAt"
}

export const makeReceipts = Effect.fnUntraced(function*(options: EndpointOptions, limits: RateLimits) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const events = yield* EventLog
  const trace = Option.getOrUndefined(yield* Effect.serviceOption(MessageTrace))
  const idleSeconds = options.receipts?.idleSeconds ?? RECEIPT_RETENTION_SECONDS
  const maxWaitMs = options.receipts?.maxWaitMs ?? 30_000
  const maxHoldMs = options.receipts?.maxHoldMs ?? 300_000
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  const book = makeReceiptBook(storage, events, idleSeconds)
  const base = endpointBase(options.endpointUrl)
  const subscriptionBase = `${base}/receipts/`
  const messageBase = `${base}/m/`
  /** The path of a push message resource, as a server push promises it. */
  const messagePath = new URL(messageBase).pathname
  /** The `Link` of every push answer: where receipt subscriptions are made. */
  const link = `<${base}/receipts>; rel="${RECEIPT_RELATION}"`
  const nowSeconds = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))

  // ── the push side ──────────────────────────────────────────────────────────────────────────────

  /** Subscriptions this process renewed, with the expiry it wrote (the real one may be later). */
  const renewed = new RecentMap<number>(10_000)

  /**
   * The receipt subscription a push's `Push-Receipt` names, its idle time started again. Only a
   * subscription URL of this service, alive, is taken.
   */
  const claim = Effect.fnUntraced(function*(url: string) {
    const id = url.startsWith(subscriptionBase) ? url.slice(subscriptionBase.length) : undefined
    if (id === undefined || !SUBSCRIPTION_ID.test(id)) {
      return yield* new InvalidReceipt({ message: `Push-Receipt must be a receipt subscription of this service (${subscriptionBase}…)` })
    }
    // A subscription this process renewed lately is alive until the expiry it wrote: pushes to it
    // renew it once per RENEW_STEP, not each (one item every push would write: a hot key).
    const now = yield* nowSeconds
    const renewAt = now + idleSeconds
    const known = renewed.get(id)
    if (known !== undefined && known > now && renewAt - known <= RENEW_STEP(idleSeconds)) return id
    const alive = yield* storage.touchReceiptSubscription(id, renewAt).pipe(Effect.catchTag("StorageError", storageUnavailable))
    if (!alive) {
      renewed.delete(id)
      return yield* new InvalidReceipt({ message: "Push-Receipt names a receipt subscription that does not exist or has expired" })
    }
    renewed.set(id, renewAt)
    return id
  })

  /**
   * A message with a receipt, accepted: its status row, opened before the message goes anywhere, so
   * every later step finds it (a failure is a 503 with nothing sent, so the sender's retry is no duplicate).
   */
  const accepting = (uaid: string, subscription: string, n: Notification, acceptedAt: number) =>
    book.open(uaid, subscription, n.version, { acceptedAt, deadline: expiresAt(n) * 1000 }).pipe(
      Effect.catchTag("StorageError", storageUnavailable),
      Effect.asVoid
    )

  /**
   * What routing decided for it, when that is a step the connection node will not record: stored,
   * dropped (TTL 0, not connected: expired), bridged (final for this service). A message stored at a
   * later ms has a new id: its row moves with it (opened under the new id). The message is on its
   * way: a failure here is logged, and the answer stays 202.
   */
  const routed = Effect.fnUntraced(function*(
    uaid: string,
    subscription: string,
    accepted: Notification,
    routedAs: Notification,
    outcome: RouteOutcome,
    acceptedAt: number
  ) {
    if (outcome !== "stored" && outcome !== "dropped" && outcome !== "bridged") return
    const now = yield* Clock.currentTimeMillis
    const moved = routedAs.version !== accepted.version
    yield* (moved ? book.open : book.write)(uaid, subscription, routedAs.version, {
      ...(moved ? { acceptedAt } : {}),
      deadline: expiresAt(routedAs) * 1000,
      ...(outcome === "stored" ? { storedAt: now } : { outcome: { outcome: outcome === "dropped" ? "expired" : "bridged", at: now } })
    })
    if (moved) yield* storage.deleteMessageStatuses(subscription, [accepted.version])
  }, Effect.catchTag("StorageError", (error) => Effect.logWarning("a receipt status could not be written", error)))

  /** A message with a receipt that its sender deleted. */
  const deleted = (uaid: string, subscription: string, messageId: string) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => book.finish(uaid, subscription, messageId, "deleted", now)).pipe(
      Effect.catchTag("StorageError", storageUnavailable),
      Effect.asVoid
    )

  // ── documents ──────────────────────────────────────────────────────────────────────────────────

  /** A message's status as JSON: its push message resource, where it is, and when each step was. */
  const statusDocument = (status: MessageStatus) => {
    const { messageId: _, ...times } = status
    return {
      message: messageBase + status.messageId,
      state: stateOf(status),
      ...(status.outcome === undefined ? {} : { status: receiptHttpStatus(status.outcome) }),
      ...times
    }
  }

  /** A status from this process's message trace (messages sent without a receipt). */
  const statusOfTrace = (messageId: string, document: TraceDocument): MessageStatus | undefined => {
    const state = TRACE_STATES[document.state]
    if (state === undefined) return undefined
    const status: Record<string, unknown> = { messageId }
    for (const event of document.events) {
      const field = TRACE_TIMES[event.type]
      if (field !== undefined) status[field] ??= event.time
    }
    if (state !== "accepted" && state !== "stored" && state !== "delivered") {
      const code = document.events.find((event) => event.type === "notification.acked.1" || event.type === "notification.nacked.1")?.data["code"]
      status.outcome = state === "acknowledged" && typeof code === "number" ? ackOutcome(code) : state
      status.outcomeAt = document.lastSeen
      if (typeof code === "number") status.code = code
    }
    return status as unknown as MessageStatus
  }

  // ── settling ───────────────────────────────────────────────────────────────────────────────────

  /** When each message was last checked for its subscription (this process). */
  const checked = new RecentMap<number>(10_000)

  /** Whether the user agent still has the subscription a message was sent to. */
  const stillSubscribed = Effect.fnUntraced(function*(messageId: string) {
    const ids = Option.getOrUndefined(yield* Effect.option(crypto.parseMessageId(messageId)))
    if (ids === undefined) return true
    const user = yield* storage.getUser(ids.uaid)
    if (user === undefined) return false
    if (user.routerType !== "webpush" || user.currentMonth === undefined) return true
    return yield* storage.hasChannel(ids.uaid, user.currentMonth, ids.channelId)
  })

  /**
   * The outcome a message without one has reached unseen, if any: its TTL ran out before delivery
   * (or well before an ack), or its subscription is gone.
   */
  const unseenOutcome = Effect.fnUntraced(function*(status: MessageStatus, now: number, budget: { checks: number }) {
    if (status.deadline !== undefined && now >= status.deadline + (status.deliveredAt === undefined ? 0 : ACK_GRACE_MS)) return "expired" as const
    const last = checked.get(status.messageId)
    if (budget.checks <= 0 || (last !== undefined && now - last < SUBSCRIPTION_CHECK_MS)) return undefined
    budget.checks--
    checked.set(status.messageId, now)
    return (yield* stillSubscribed(status.messageId)) ? undefined : "unsubscribed" as const
  })

  /**
   * A subscription's receipts now: the statuses with an outcome, after settling the others. Its idle
   * time starts again (`RENEW_STEP`). Undefined when it is unknown or expired.
   */
  const receiptsOf = Effect.fnUntraced(function*(id: string) {
    const subscription = yield* storage.readReceiptSubscription(id)
    if (subscription === undefined) return undefined
    const now = yield* Clock.currentTimeMillis
    const renewAt = Math.floor(now / 1000) + idleSeconds
    if (renewAt - subscription.expiry > RENEW_STEP(idleSeconds)) yield* storage.touchReceiptSubscription(id, renewAt)
    const receipts: Array<MessageStatus> = []
    const budget = { checks: SUBSCRIPTION_CHECKS_PER_READ }
    for (const status of subscription.statuses) {
      if (status.outcome !== undefined) {
        receipts.push(status)
        continue
      }
      // The message id is decrypted only for a message whose outcome is decided now (its uaid names the event).
      const outcome = yield* unseenOutcome(status, now, budget)
      if (outcome === undefined) continue
      const ids = Option.getOrUndefined(yield* Effect.option(crypto.parseMessageId(status.messageId)))
      // Another node may have recorded an outcome meanwhile: the next read shows that one.
      if (yield* book.finish(ids?.uaid ?? "", id, status.messageId, outcome, now)) receipts.push({ ...status, outcome, outcomeAt: now })
    }
    return receipts
  })

  // ── held collectors ────────────────────────────────────────────────────────────────────────────

  const caps = {
    subscription: options.receipts?.maxCollectorsPerSubscription ?? 4,
    address: options.receipts?.maxCollectorsPerAddress ?? 32,
    node: options.receipts?.maxCollectors ?? 1024
  }
  /** A held collector: when its hold ends at the latest (ms). */
  interface Hold {
    readonly until: number
  }
  const bySubscription = new Map<string, Set<Hold>>()
  const byAddress = new Map<string, Set<Hold>>()
  let holding = 0
  const heldGauge = metrics?.gauge(METRICS.receiptCollectors.name)
  const refusedCount = (limit: "subscription" | "address" | "node") => metrics?.counter(METRICS.receiptCollectorsRefused.name, { limit }).inc()
  const endedCount = (reason: "max_hold" | "stalled") => metrics?.counter(METRICS.receiptCollectorsEnded.name, { reason }).inc()
  /** Seconds until one of `holds` ends at the latest. */
  const retryAfter = (holds: ReadonlySet<Hold>, now: number): number => {
    let first = Number.POSITIVE_INFINITY
    for (const hold of holds) first = Math.min(first, hold.until)
    return Math.max(1, Math.ceil((first - now) / 1000))
  }
  const addTo = (map: Map<string, Set<Hold>>, key: string, hold: Hold) => {
    const holds = map.get(key)
    if (holds === undefined) map.set(key, new Set([hold]))
    else holds.add(hold)
  }
  const removeFrom = (map: Map<string, Set<Hold>>, key: string, hold: Hold) => {
    const holds = map.get(key)
    holds?.delete(hold)
    if (holds?.size === 0) map.delete(key)
  }

  /** A collector of `id` from `address`, held until `until`, admitted or refused at a cap. */
  const admit = (id: string, address: string | undefined, now: number, until: number): Effect.Effect<Hold, TooManyCollectors | Overloaded> => {
    const ofSubscription = bySubscription.get(id)
    if (ofSubscription !== undefined && ofSubscription.size >= caps.subscription) {
      refusedCount("subscription")
      return Effect.fail(new TooManyCollectors({ by: "receipt subscription", retryAfter: retryAfter(ofSubscription, now) }))
    }
    const ofAddress = address === undefined ? undefined : byAddress.get(address)
    if (ofAddress !== undefined && ofAddress.size >= caps.address) {
      refusedCount("address")
      return Effect.fail(new TooManyCollectors({ by: "address", retryAfter: retryAfter(ofAddress, now) }))
    }
    if (holding >= caps.node) {
      refusedCount("node")
      return Effect.fail(new Overloaded())
    }
    const hold: Hold = { until }
    addTo(bySubscription, id, hold)
    if (address !== undefined) addTo(byAddress, address, hold)
    holding++
    heldGauge?.add(1)
    return Effect.succeed(hold)
  }
  const release = (id: string, address: string | undefined, hold: Hold) =>
    Effect.sync(() => {
      removeFrom(bySubscription, id, hold)
      if (address !== undefined) removeFrom(byAddress, address, hold)
      holding--
      heldGauge?.add(-1)
    })

  // ── HTTP ───────────────────────────────────────────────────────────────────────────────────────

  /** `POST /receipts`: a new receipt subscription, its URL in `Location` (counted against the sender's address limit). */
  const subscribe = Effect.fnUntraced(function*(req: IncomingMessage) {
    yield* limits.address(peerOf(req), req.headers["x-forwarded-for"], yield* Clock.currentTimeMillis)
    const id = randomBytes(16).toString("base64url")
    yield* storage.createReceiptSubscription(id, (yield* nowSeconds) + idleSeconds).pipe(Effect.catchTag("StorageError", storageUnavailable))
    return { status: 201, headers: { location: subscriptionBase + id, link } }
  })

  /**
   * `GET /m/{message_id}`: the message's status, from its receipt, or else this process's trace
   * (which reads its whole window: counted against the sender's address limit, as pushes are).
   */
  const status = Effect.fnUntraced(function*(messageId: string, req: IncomingMessage) {
    yield* limits.address(peerOf(req), req.headers["x-forwarded-for"], yield* Clock.currentTimeMillis)
    const ids = yield* Effect.option(crypto.parseMessageId(messageId))
    const subscription = ids._tag === "Some" ? ids.value.receipt : undefined
    const found = subscription !== undefined
      ? yield* storage.getMessageStatus(subscription, messageId).pipe(Effect.catchTag("StorageError", storageUnavailable))
      : undefined
    const traced = found ?? (ids._tag === "Some" && trace !== undefined ? traceStatus(messageId) : undefined)
    if (traced === undefined) return yield* new ReceiptNotFound({ message: "No status is kept for this message" })
    return statusDocument(traced)
  })
  const traceStatus = (messageId: string): MessageStatus | undefined => {
    const document = trace?.lookup(messageId)
    return document === undefined ? undefined : statusOfTrace(messageId, document)
  }

  const notFound = new ReceiptNotFound({ message: "No such receipt subscription, or it has expired" })

  /**
   * `GET /receipts/{id}`, on the request itself (its answer may be held open): receipts as HTTP/2
   * server pushes (RFC 8030 §6.2), as server-sent events, or as one JSON document once there are
   * some (or the wait is over). A receipt handed out is removed once it was written. Fails only
   * before anything is written. Counted against the address's rate limit as it starts, and held
   * only within the collector caps, for at most `maxHoldMs`.
   */
  const collect = (id: string, req: IncomingMessage, res: ServerResponse, headers: Readonly<Record<string, string>>) =>
    Effect.gen(function*() {
      if (!SUBSCRIPTION_ID.test(id)) return yield* notFound
      const now = yield* Clock.currentTimeMillis
      yield* limits.address(peerOf(req), req.headers["x-forwarded-for"], now)
      const delivery = deliveryOf(req)
      const holdMs = delivery === "json" ? Math.min(maxWaitMs, maxHoldMs, preferredWaitMs(req.headers.prefer) ?? maxWaitMs) : maxHoldMs
      // Counted by address as the rate limits count it (the loopback, not a listed proxy, is none).
      const address = limits.clientOf(peerOf(req), req.headers["x-forwarded-for"])
      const hold = yield* admit(id, address, now, now + holdMs)
      return yield* held(id, delivery, res, headers, now + holdMs).pipe(
        // Storage or the client stuck past the hold: the collector ends all the same.
        Effect.timeoutOrElse({
          duration: holdMs + HOLD_GRACE_MS,
          orElse: () =>
            Effect.suspend(() => {
              endedCount("stalled")
              return res.headersSent ? Effect.sync(() => void res.destroy()) : Effect.fail(new StorageUnavailable())
            })
        }),
        // The server stops: a held answer ends (an SSE client reconnects, a push client asks again).
        Effect.onInterrupt(() =>
          Effect.sync(() => {
            if (!res.headersSent) res.writeHead(204, headers)
            res.end()
          })
        ),
        Effect.ensuring(release(id, address, hold))
      )
    })

  /** A collector within the caps, held until `until` (ms) at most. */
  const held = (id: string, delivery: Delivery, res: ServerResponse, headers: Readonly<Record<string, string>>, until: number) =>
    Effect.gen(function*() {
      const left = Effect.map(Clock.currentTimeMillis, (now) => Math.max(0, until - now))
      const read = receiptsOf(id).pipe(Effect.catchTag("StorageError", storageUnavailable))
      const handed = (receipts: ReadonlyArray<MessageStatus>) =>
        storage.deleteMessageStatuses(id, receipts.map((r) => r.messageId)).pipe(
          Effect.catchTag("StorageError", (error) => Effect.logWarning("collected receipts could not be removed", error))
        )
      const first = yield* read
      if (first === undefined) return yield* notFound

      if (delivery === "json") {
        let all = first
        for (let wait = yield* left; all.length === 0 && wait > 0; wait = yield* left) {
          yield* Effect.sleep(Math.min(RECEIPT_POLL_MS, wait))
          const next = yield* read
          if (next === undefined) return yield* notFound
          all = next
        }
        const receipts = all.slice(0, RECEIPTS_PER_ANSWER)
        // Removed before they are answered: a sender that asks again at once must not get them twice.
        yield* handed(receipts)
        const body = JSON.stringify({ receipts: receipts.map(statusDocument) })
        return yield* written(res, 200, { ...headers, "content-type": "application/json", "cache-control": "no-store" }, body)
      }

      // Held open until the client leaves, the subscription expires, the hold is over or the server stops.
      if (delivery === "events") {
        res.writeHead(200, { ...headers, "content-type": "text/event-stream", "cache-control": "no-store" })
        res.flushHeaders()
      }
      // A receipt is removed once it went out (one the client refused stays for the next try).
      const send = (receipts: ReadonlyArray<MessageStatus>) =>
        Effect.forEach(receipts, (receipt) =>
          (delivery === "events" ? sentEvent(res, receipt) : pushed(res, receipt)).pipe(
            Effect.flatMap((sent) => (sent ? handed([receipt]) : Effect.void))
          ), { discard: true })
      let receipts: ReadonlyArray<MessageStatus> | undefined = first
      let quiet = 0
      while (receipts !== undefined) {
        yield* send(receipts)
        const wait = yield* left
        if (wait <= 0) break
        const pause = Math.min(RECEIPT_POLL_MS, wait)
        yield* Effect.sleep(pause)
        quiet = receipts.length > 0 ? 0 : quiet + pause
        if (delivery === "events" && quiet >= SSE_HEARTBEAT_MS) {
          quiet = 0
          res.write(": keepalive\n\n")
        }
        receipts = yield* read
      }
      if (receipts !== undefined) {
        // The longest hold is over: ended as when the server stops (the client asks again).
        endedCount("max_hold")
        if (delivery === "events") res.end()
        else yield* written(res, 204, headers, "")
      } else if (delivery === "events") res.end("event: gone\ndata: {}\n\n")
      else yield* written(res, 204, headers, "")
    })

  /** One receipt as an event: its id is the message's, its data the status document. */
  const sentEvent = (res: ServerResponse, receipt: MessageStatus) =>
    Effect.callback<boolean>((resume) => {
      res.write(`id: ${receipt.messageId}\nevent: receipt\ndata: ${JSON.stringify(statusDocument(receipt))}\n\n`, (error) =>
        resume(Effect.succeed(error == null)))
    })

  /**
   * One receipt as an HTTP/2 server push: a promised `GET` of the push message resource, answered
   * with its status (410 for an acknowledged message) and the status document.
   */
  const pushed = (res: ServerResponse, receipt: MessageStatus) =>
    Effect.callback<boolean>((resume) => {
      ;(res as unknown as Http2ServerResponse).createPushResponse({ ":method": "GET", ":path": messagePath + receipt.messageId }, (error, pushRes) => {
        if (error !== null) return resume(Effect.succeed(false))
        const body = JSON.stringify(statusDocument(receipt))
        pushRes.writeHead(receiptHttpStatus(receipt.outcome ?? "acknowledged"), { "content-type": "application/json" })
        pushRes.end(body, () => resume(Effect.succeed(true)))
      })
    })

  return { claim, accepting, routed, deleted, link, subscribe, status, collect }
})

export type Receipts = Effect.Success<ReturnType<typeof makeReceipts>>

/** Write a whole answer; done once it is handed to the connection. */
const written = (res: ServerResponse, status: number, headers: Readonly<Record<string, string>>, body: string) =>
  Effect.callback<void>((resume) => {
    res.writeHead(status, body === "" ? headers : { ...headers, "content-length": String(Buffer.byteLength(body)) })
    res.end(body, () => resume(Effect.void))
  })
