/**
 * Client addresses as the node counts them, for the rate limits and the connection caps alike:
 * IPv4-mapped IPv6 addresses are plain IPv4, lists of addresses and CIDR blocks are `BlockList`s,
 * and an IPv6 client is counted by its /64 (the block one subscriber usually gets).
 */
import { BlockList, isIP } from "node:net"

/** The loopback: this machine (a proxy in front, a sender beside), whose clients cannot be told apart. */
export const LOOPBACK: ReadonlyArray<string> = ["127.0.0.0/8", "::1"]

/** `::ffff:1.2.3.4` is the IPv4 client 1.2.3.4. */
export const plainAddress = (address: string): string =>
  address.startsWith("::ffff:") && isIP(address.slice(7)) === 4 ? address.slice(7) : address

/** A list of addresses and CIDR blocks (`10.0.0.1`, `10.0.0.0/8`, `fd00::/8`, checked by the config). */
export const addressList = (entries: ReadonlyArray<string>): BlockList => {
  const list = new BlockList()
  for (const entry of entries) {
    const [address = "", prefix] = entry.split("/")
    const family = isIP(address) === 6 ? "ipv6" : "ipv4"
    if (prefix === undefined) list.addAddress(address, family)
    else list.addSubnet(address, Number(prefix), family)
  }
  return list
}

/** Whether `address` (plain) is in `list`; an address that is not one never is. */
export const inList = (list: BlockList, address: string): boolean => {
  const family = isIP(address)
  return family !== 0 && list.check(address, family === 6 ? "ipv6" : "ipv4")
}

/** What an address is counted as: an IPv4 address itself, an IPv6 one by its /64 (`2001:db8:0:1/64`). */
export const countedAddress = (address: string): string => (isIP(address) === 6 ? `${sixtyFour(address)}/64` : address)

/** The first four groups of an IPv6 address, written out. */
const sixtyFour = (address: string): string => {
  const [head = "", tail = ""] = address.split("::")
  const left = head === "" ? [] : head.split(":")
  const right = address.includes("::") ? (tail === "" ? [] : tail.split(":")) : []
  const groups = [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill("0"), ...right]
  return groups.slice(0, 4).map((group) => (group === "" ? "0" : group.toLowerCase().replace(/^0+(?=.)/, ""))).join(":")
}

/** Loopback, private (RFC 1918, RFC 4193 unique-local), link-local and shared (RFC 6598) address space. */
const PRIVATE = addressList([...LOOPBACK, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10", "fc00::/7", "fe80::/10"])

/**
 * Whether a listener bound to `host` is reachable only from this machine or a private network: a
 * loopback or private address, or `localhost`. The any-address (`0.0.0.0`, `::`) is not, nor is a
 * host name (it may resolve to anything).
 */
export const isPrivateBind = (host: string): boolean => {
  const address = plainAddress(host.replace(/^\[(.*)\]$/, "$1"))
  return address === "localhost" || inList(PRIVATE, address)
}
