/**
 * Routing an accepted notification to a WebPush user, as Mozilla's autopush routes it:
 *
 * 1. the user has a `node_id` → `PUT {node}/push/{uaid}` for its session connected at `connected_at`;
 *    200 → delivered ("direct"; a topic message then replaces the stored one of its topic, which
 *    autopush leaves for a later session to deliver after it); another status (not there, another
 *    session, the channel unregistered in that session, queue full) → go on; a transport failure →
 *    clear `node_id` (only if it and `connected_at` still match), go on;
 * 2. TTL 0 → nothing is stored ("dropped");
 * 3. store in the user's message table (failure → 503/201); a timestamp message whose ms is taken
 *    for its channel goes to the next ms, under a new id. Not when the subscription has
 *    `maxStoredPerSubscription` messages stored already (a message replacing its topic's row adds
 *    none): refused 429/119 ("refused"), so that no sender can make a user's backlog pass
 *    `msg_limit` alone, nor fill storage for a client that is away or reads slowly;
 * 4. re-read the user: gone → 410/105; moved to another month's table since the record the message
 *    was stored by was read (a cached record, or a move that raced the store) → the message follows
 *    it there (`followMove`); connected somewhere → `PUT {node}/notif/{uaid}` so that node picks the
 *    message up (a client that reconnected while we stored would otherwise miss it). Unreadable:
 *    the message stays where it is, which is right unless it went to an older month's table (the
 *    user may have moved): then it is taken back and the push answered 503, never 201 for a
 *    message no hello reads.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { TooManyStored, UserDeletedDuringRouting } from "../domain/errors.ts"
import type { RouteOutcome } from "../domain/events.ts"
import { messageKeyOf, type Notification, sortkeyMs } from "../domain/notification.ts"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { tableMovedTo, type UserRecord } from "../domain/user.ts"
import { saveAtFreeMs } from "../storage/messageRules.ts"
import { nextFreeMs } from "../storage/model.ts"
import { Storage, type StorageError } from "../storage/Storage.ts"
import { messageSpans } from "../observability/tracing.ts"
import { NodeClient } from "./NodeClient.ts"

export interface WebPushRouterOptions {
  /** Messages one subscription may have stored (not yet received by its client); 0: no bound; default `DEFAULT_MAX_STORED_PER_SUBSCRIPTION`. */
  readonly maxStoredPerSubscription?: number | undefined
}

/** Messages one subscription may have stored by default: autopush's `msg_limit`. */
const DEFAULT_MAX_STORED_PER_SUBSCRIPTION = 100

/**
 * When a sender whose push was refused for its subscription's stored messages may retry (s): soon
 * while the client is connected (reading them), later while it is away (nothing drains meanwhile).
 */
const RETRY_CONNECTED_S = 10
const RETRY_AWAY_S = 300

/** What became of a message: its outcome, and the message as routed (stored at a later ms, it has a new id). */
interface Routed {
  readonly outcome: Extract<RouteOutcome, "direct" | "stored" | "dropped">
  readonly notification: Notification
  /** Stored: the router record as read after the store (undefined when it could not be read). */
  readonly reread?: UserRecord | undefined
}

export interface WebPushRouterService {
  /** Route `notification` to `user`, whose messages live in `table`. */
  readonly route: (
    user: UserRecord,
    table: string,
    notification: Notification
  ) => Effect.Effect<Routed, StorageError | UserDeletedDuringRouting | TooManyStored>
  /**
   * Step 1 alone, for a router record that may be out of date: delivered to the node it names, or
   * undefined (then route on a fresh record).
   */
  readonly routeDirect: (user: UserRecord, table: string, notification: Notification) => Effect.Effect<Routed | undefined>
}

/** The router over the node client and storage, with `options`' bound. */
const makeWebPushRouter = (options: WebPushRouterOptions) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const node = yield* NodeClient
    const crypto = yield* EndpointCrypto
    const spans = yield* messageSpans

    /**
     * Step 3: store. Two timestamp messages of one channel in the same ms would share a storage key:
     * the later one takes the next free ms, with a message id that names it. (A topic message that
     * a newer one of its topic superseded meanwhile is not written: it was replaced.)
     */
    const store = (uaid: string, table: string, first: Notification) =>
      Effect.gen(function*() {
        const { placed } = yield* saveAtFreeMs((n) => storage.saveMessage(uaid, table, n), first, function*(taken) {
          const moved = nextFreeMs(taken)
          const version = yield* crypto.makeMessageId({
            kind: "timestamp",
            uaid,
            channelId: moved.channelId,
            sortkeyTimestamp: sortkeyMs(moved),
            receipt: moved.receipt
          })
          return { ...moved, version }
        })
        return placed
      })

    /** The node is gone: forget it unless the client has reconnected since (then the record changed). */
    const forgetNode = (uaid: string, nodeId: string, connectedAt: number) =>
      storage.clearNodeId(uaid, nodeId, connectedAt).pipe(
        Effect.catch((error) => Effect.logWarning("clearing node_id failed", error)),
        Effect.asVoid
      )

    /**
     * A topic message its client got directly replaces the stored one of its topic, which a later
     * session would otherwise deliver after it. The push is delivered whatever this does: a failure
     * is logged, not answered.
     */
    const replaceStoredTopic = (uaid: string, table: string, notification: Notification) =>
      notification.topic === undefined ? Effect.void : storage.replaceTopicMessage(uaid, table, notification).pipe(
        Effect.catchTag("StorageError", (error) => Effect.logWarning("replacing a stored topic message failed", error)),
        Effect.asVoid
      )

    /** Step 1: true when the node took it for its connected client. */
    const deliverDirect = (user: UserRecord, table: string, nodeId: string, notification: Notification) =>
      Effect.matchEffect(node.push(nodeId, user.uaid, notification, user.connectedAt), {
        onSuccess: (status) => status === 200 ? replaceStoredTopic(user.uaid, table, notification).pipe(Effect.as(true)) : Effect.succeed(false),
        onFailure: () => forgetNode(user.uaid, nodeId, user.connectedAt).pipe(Effect.as(false)) // a NodeTransportError: the node is gone
      })

    /**
     * Step 4, the user moved to table `to` since `stored` went into `from`: saved into `to` (at the
     * same key, under the same id), then taken out of `from` — only if still there: a session may
     * have read and acked it there meanwhile, or a newer message of its topic replaced it, and then
     * the copy in `to` is taken back. Save first: a cut between the two steps (the process dies; an
     * interrupt cannot cut it, delivery being uninterruptible) leaves it in both tables, delivered
     * from `to`, never in neither. A failure answers the push 503, as for a store that failed.
     */
    const followMove = Effect.fnUntraced(function*(uaid: string, from: string, to: string, stored: Notification) {
      const [saved] = yield* storage.saveMessages(uaid, to, [stored])
      if (yield* storage.deleteMessage(uaid, from, messageKeyOf(stored), stored.version)) return saved ?? stored
      if (saved !== undefined) yield* storage.deleteMessage(uaid, to, messageKeyOf(saved), saved.version)
      return stored
    })

    /**
     * A push that will fail on `error` (answered 503) after its message was stored: the message is
     * taken back, so that the answer holds (if even that fails, it stays, and may still be delivered).
     */
    const refuse = (uaid: string, table: string, stored: Notification, error: StorageError) =>
      // A topic message is left where it is: its row replaced the topic's previous message, which
      // taking it back would lose too (answered 201 maybe); the sender's retry replaces it again.
      stored.topic !== undefined ? Effect.fail(error) : storage.deleteMessage(uaid, table, messageKeyOf(stored), stored.version).pipe(
        Effect.catchTag("StorageError", (cleanup) => Effect.logWarning("taking back a refused message failed", cleanup)),
        Effect.andThen(Effect.fail(error))
      )

    /** Step 4: poke the node the user is connected to now, if any. */
    const pokeCurrentNode = (fresh: UserRecord) => {
      const nodeId = fresh.nodeId
      if (nodeId === undefined) return Effect.void
      return node.notify(nodeId, fresh.uaid).pipe(Effect.catchTag("NodeTransportError", () => forgetNode(fresh.uaid, nodeId, fresh.connectedAt)))
    }

    /** Step 4: the record read again after the store, the message moved where it now lives, the node poked. */
    const afterStore = Effect.fnUntraced(function*(uaid: string, table: string, stored: Notification) {
      const fresh = yield* storage.getUser(uaid).pipe(Effect.catchTag("StorageError", (error) =>
        Effect.flatMap(storage.currentMessageTable, (current) =>
          // This month's table is the newest a user lives in: a message there is where the user is.
          table === current ? Effect.succeed(null) : refuse(uaid, table, stored, error))))
      if (fresh === undefined) return yield* new UserDeletedDuringRouting()
      if (fresh === null) return { outcome: "stored", notification: stored } satisfies Routed
      const moved = tableMovedTo(table, fresh)
      const placed = moved === undefined ? stored : yield* followMove(uaid, table, moved, stored)
      yield* pokeCurrentNode(fresh)
      return { outcome: "stored", notification: placed, reread: fresh } satisfies Routed
    })

    /** Step 3's bound: the subscription may not have `maxStoredPerSubscription` stored already. */
    const withinStoredBound = Effect.fnUntraced(function*(user: UserRecord, table: string, notification: Notification) {
      const bound = options.maxStoredPerSubscription ?? DEFAULT_MAX_STORED_PER_SUBSCRIPTION
      if (bound <= 0) return
      const stored = yield* storage.countChannelMessages(user.uaid, table, notification.channelId, bound, notification.topic)
      if (stored >= bound) return yield* new TooManyStored({ retryAfter: user.nodeId === undefined ? RETRY_AWAY_S : RETRY_CONNECTED_S })
    })

    const route = Effect.fnUntraced(function*(
      user: UserRecord,
      table: string,
      notification: Notification
    ): Effect.fn.Return<Routed, StorageError | UserDeletedDuringRouting | TooManyStored> {
      if (user.nodeId !== undefined && (yield* deliverDirect(user, table, user.nodeId, notification))) return { outcome: "direct", notification }
      if (notification.ttl === 0) return { outcome: "dropped", notification }
      yield* withinStoredBound(user, table, notification)
      const stored = yield* store(user.uaid, table, notification).pipe(spans.span("notification.store"))
      return yield* afterStore(user.uaid, table, stored)
    })

    const routeDirect = (user: UserRecord, table: string, notification: Notification): Effect.Effect<Routed | undefined> =>
      user.nodeId === undefined
        ? Effect.undefined
        : Effect.map(deliverDirect(user, table, user.nodeId, notification), (took) => (took ? { outcome: "direct", notification } : undefined))

    const traced = <A extends Routed | undefined, E>(routing: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      routing.pipe(
        Effect.tap((routed) => Effect.annotateCurrentSpan("autopush.outcome", routed?.outcome ?? "not-direct")),
        spans.span("notification.route")
      )

    return WebPushRouter.of(spans.enabled
      ? {
        route: (user, table, notification) => traced(route(user, table, notification)),
        routeDirect: (user, table, notification) => traced(routeDirect(user, table, notification))
      }
      : { route, routeDirect })
  })

export class WebPushRouter extends Context.Service<WebPushRouter, WebPushRouterService>()(
  "autopush/routers/WebPushRouter"
) {
  static readonly layerWith = (options: WebPushRouterOptions): Layer.Layer<WebPushRouter, never, Storage | NodeClient | EndpointCrypto> =>
    Layer.effect(WebPushRouter, makeWebPushRouter(options))

  static readonly layer = WebPushRouter.layerWith({})
}
