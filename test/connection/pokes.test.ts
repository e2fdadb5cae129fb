/**
 * Storage pokes (`PUT /notif/{uaid}` on the router port) are coalesced: a session has at most one
 * storage check waiting in its mailbox, whatever the number of pokes, and a poke that finds one
 * waiting is answered as taken (the check it joins will see what the poke announced).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeNodeRegistry } from "../../src/connection/registry.ts"
import { SessionHandle } from "../../src/protocol/session.ts"

const UAID = "0123456789abcdef0123456789abcdef"

const identified = () => {
  const registry = makeNodeRegistry()
  const handle = new SessionHandle(128, Number.POSITIVE_INFINITY)
  registry.track(handle)
  handle.uaid = UAID
  registry.register(handle)
  return { registry, handle }
}

describe("storage pokes", () => {
  it("200,000 pokes to a busy session leave one storage check in its mailbox", () => {
    const { registry, handle } = identified()
    for (let i = 0; i < 200_000; i++) assert.isTrue(registry.checkStorage(UAID))
    assert.strictEqual(handle.mailbox.size, 1)
    assert.deepStrictEqual(handle.mailbox.poll(), { _tag: "CheckStorage" })
    assert.strictEqual(handle.mailbox.size, 0)
  })

  it("once the check is taken, the next poke queues another (what it announced may be newer than that check's read)", () => {
    const { registry, handle } = identified()
    registry.checkStorage(UAID)
    handle.mailbox.offer({ _tag: "Tick" })
    registry.checkStorage(UAID)
    assert.strictEqual(handle.mailbox.size, 2)
    assert.deepStrictEqual(handle.mailbox.poll(), { _tag: "CheckStorage" })
    assert.isTrue(registry.checkStorage(UAID))
    assert.deepStrictEqual([handle.mailbox.poll(), handle.mailbox.poll(), handle.mailbox.poll()], [{ _tag: "Tick" }, { _tag: "CheckStorage" }, undefined])
  })

  it.effect("a poke handed straight to a waiting session leaves nothing pending: the next one is queued", () =>
    Effect.gen(function*() {
      const { registry, handle } = identified()
      const taken: Array<string> = []
      const consumer = { receive: (event: { readonly _tag: string }) => Effect.sync(() => void taken.push(event._tag)) }
      yield* Effect.forkChild(handle.mailbox.take(consumer), { startImmediately: true })
      assert.isTrue(registry.checkStorage(UAID))
      yield* Effect.yieldNow
      assert.deepStrictEqual(taken, ["CheckStorage"])
      assert.isTrue(registry.checkStorage(UAID))
      assert.isTrue(registry.checkStorage(UAID))
      assert.strictEqual(handle.mailbox.size, 1)
    }))

  it("a poke for a uaid with no session here (one resuming it, not yet registered) reaches the session that registers next; once", () => {
    const registry = makeNodeRegistry()
    assert.isFalse(registry.checkStorage(UAID), "nobody here to take it")
    const handle = new SessionHandle(128, Number.POSITIVE_INFINITY)
    registry.track(handle)
    handle.uaid = UAID
    registry.register(handle)
    assert.deepStrictEqual(handle.mailbox.poll(), { _tag: "CheckStorage" })
    const next = new SessionHandle(128, Number.POSITIVE_INFINITY)
    registry.track(next)
    next.uaid = UAID
    registry.register(next)
    assert.isUndefined(next.mailbox.poll(), "the missed poke was handed over once")
  })

  it("ticks and kicks likewise: one of each waits; frames and deliveries are not coalesced", () => {
    const { handle } = identified()
    const { mailbox } = handle
    for (let i = 0; i < 1_000; i++) {
      mailbox.offer({ _tag: "Tick" })
      mailbox.offerFirst({ _tag: "Kick", kind: i === 0 ? "control-flood" : "ghost" })
    }
    mailbox.offer({ _tag: "Frame", message: { messageType: "ping" } })
    mailbox.offer({ _tag: "Frame", message: { messageType: "ping" } })
    assert.strictEqual(mailbox.size, 4)
    // The first kick stays first: the reason the session closes for.
    assert.deepStrictEqual(mailbox.poll(), { _tag: "Kick", kind: "control-flood" })
  })

  it("a session that is gone is not poked", () => {
    const { registry, handle } = identified()
    registry.remove(handle)
    handle.mailbox.close()
    assert.isFalse(registry.checkStorage(UAID))
  })
})
