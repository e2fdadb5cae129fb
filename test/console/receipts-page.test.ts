/**
 * The receipt code the console page and the push command line share (src/console/static/receipts.js):
 * a status document in words, each step after the push was accepted, and which states are final.
 */
import { assert, describe, it } from "@effect/vitest"
import { describeStatus, describeSteps, FINAL_STATES, isFinal, receiptHeaders } from "../../src/console/static/receipts.js"
import { RECEIPT_OUTCOMES } from "../../src/domain/receipt.ts"

const accepted = 1_700_000_000_000

describe("console receipts", () => {
  it("a status document in one line: the state, then each step after the push, with the client's code", () => {
    assert.strictEqual(
      describeStatus({ state: "acknowledged", acceptedAt: accepted, deliveredAt: accepted + 12, outcome: "acknowledged", outcomeAt: accepted + 30, code: 100 }),
      "acknowledged — delivered 12 ms, acknowledged 30 ms after the push (code 100)"
    )
    assert.strictEqual(
      describeStatus({ state: "rejected", acceptedAt: accepted, storedAt: accepted + 4, deliveredAt: accepted + 2_345, outcome: "rejected", outcomeAt: accepted + 125_000, code: 101 }),
      "rejected — stored 4 ms, delivered 2.3 s, rejected 2 min 5 s after the push (code 101)"
    )
    assert.strictEqual(describeStatus({ state: "expired", acceptedAt: accepted, outcome: "expired", outcomeAt: accepted + 3 }), "expired — expired 3 ms after the push, never delivered")
    assert.strictEqual(describeStatus({ state: "stored", acceptedAt: accepted, storedAt: accepted + 5 }), "stored — stored 5 ms after the push")
    assert.strictEqual(describeSteps({ acceptedAt: accepted, deliveredAt: accepted + 119_600 }), "delivered 2 min 0 s after the push")
  })

  it("no step yet, or no time to count from: the state alone", () => {
    assert.strictEqual(describeSteps({ acceptedAt: accepted }), "")
    assert.strictEqual(describeStatus({ state: "accepted", acceptedAt: accepted }), "accepted")
    assert.strictEqual(describeStatus({ state: "delivered", deliveredAt: accepted }), "delivered")
  })

  it("the outcomes are final, the steps before them are not; a receipt push asks for respond-async", () => {
    assert.deepStrictEqual([...FINAL_STATES], [...RECEIPT_OUTCOMES], "the page's copy of the service's outcomes")
    assert.deepStrictEqual(FINAL_STATES.filter((state) => isFinal({ state })), [...FINAL_STATES])
    for (const state of ["accepted", "stored", "delivered"]) assert.isFalse(isFinal({ state }), state)
    assert.deepStrictEqual(receiptHeaders("http://push.test/receipts/abc"), { "Push-Receipt": "http://push.test/receipts/abc", Prefer: "respond-async" })
  })
})
