/**
 * What the DynamoDB message tables need beyond the item codec (`../items.ts`): which rows a read
 * returns, a message's key, and requests cut to the API's batch sizes.
 */
import type { Notification } from "../../domain/notification.ts"
import { type Item, messageFromItem, num, S } from "../items.ts"
import { isVisible } from "../model.ts"

const rowVisible = (item: Item, nowMs: number): boolean =>
  isVisible(num(item.expiry) ?? (num(item.timestamp) ?? 0) + (num(item.ttl) ?? 0), nowMs)

export const visibleMessages = (items: ReadonlyArray<Item>, nowMs: number): Array<Notification> =>
  items.flatMap((item) => {
    const message = rowVisible(item, nowMs) ? messageFromItem(item) : undefined
    return message === undefined ? [] : [message]
  })

export const messageKey = (uaid: string, sortKey: string): Item => ({ uaid: S(uaid), chidmessageid: S(sortKey) })

export const chunks = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> =>
  Array.from({ length: Math.ceil(items.length / size) }, (_, i) => items.slice(i * size, (i + 1) * size))
