/**
 * How the connection node delivered a message, from its `/__trace__/{message_id}` on the router
 * port: the `notification.delivered.1` event's source, `direct` or `stored`; undefined when the
 * trace does not have it (not delivered yet, or out of its window).
 */
import { type Agent, request } from "node:http"

export interface Routes {
  readonly direct: number
  readonly stored: number
  /** Not in the trace (any more), or not delivered. */
  readonly unknown: number
}

export const deliveredSource = (routerUrl: string, messageId: string, agent: Agent): Promise<string | undefined> =>
  new Promise((resolve) => {
    const req = request(`${routerUrl}/__trace__/${encodeURIComponent(messageId)}`, { agent }, (res) => {
      let text = ""
      res.on("data", (chunk: Buffer) => void (text += chunk.toString()))
      res.on("end", () => {
        if (res.statusCode !== 200) return resolve(undefined)
        const trace = JSON.parse(text) as { readonly events: ReadonlyArray<{ readonly type: string; readonly data: Record<string, unknown> }> }
        resolve(trace.events.find((e) => e.type === "notification.delivered.1")?.data["source"] as string | undefined)
      })
    })
    req.on("error", () => resolve(undefined))
    req.end()
  })

/** Count the sources of `messageIds`' deliveries. */
export const routesOf = async (routerUrl: string, messageIds: ReadonlyArray<string>, agent: Agent): Promise<Routes> => {
  const sources = await Promise.all(messageIds.map((id) => deliveredSource(routerUrl, id, agent)))
  return {
    direct: sources.filter((s) => s === "direct").length,
    stored: sources.filter((s) => s === "stored").length,
    unknown: sources.filter((s) => s !== "direct" && s !== "stored").length
  }
}

/** "97.5 % (195 direct, 5 stored)": the share delivered directly. */
export const directShareText = ({ direct, stored, unknown }: Routes): string => {
  const total = direct + stored + unknown
  return `${total === 0 ? "–" : `${((direct / total) * 100).toFixed(1)} %`} (${direct} direct, ${stored} stored${unknown > 0 ? `, ${unknown} not traced` : ""})`
}
