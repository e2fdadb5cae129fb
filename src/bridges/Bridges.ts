/**
 * The bridges this endpoint node has, by router type: what the registration API registers users
 * with and what messages to bridged users go through. Which ones exist is configuration (FCM apps,
 * APNs channels, ADM profiles, the stub switch); a type without configuration has no bridge.
 *
 * `gcm` registrations are FCM registrations (users are stored as `fcm`): the legacy GCM API is gone.
 */
import { readFileSync } from "node:fs"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import { StartupError } from "../platform/startup.ts"
import { type AdmOptions, type AdmProfile, makeAdmRouter } from "./adm.ts"
import { type ApnsChannel, type ApnsOptions, makeApnsRouter } from "./apns.ts"
import { type BridgeRouter, inlineOrFile } from "./bridge.ts"
import { type FcmApp, type FcmOptions, makeFcmRouter, type ServiceAccount } from "./fcm.ts"
import { makeStubRouter } from "./stub.ts"

interface BridgesService {
  /** The bridge of a router type (any case); undefined when this node has none. */
  readonly get: (routerType: string) => BridgeRouter | undefined
  /** Platforms configured (health document). */
  readonly platforms: ReadonlyArray<string>
}

export interface BridgeOptions {
  readonly fcm?: FcmOptions | undefined
  readonly apns?: ApnsOptions | undefined
  readonly adm?: AdmOptions | undefined
  readonly stub?: boolean | undefined
}

const make = (routers: ReadonlyArray<BridgeRouter>): BridgesService => {
  const byType = new Map<string, BridgeRouter>(routers.map((router) => [router.platform, router]))
  const fcm = byType.get("fcm")
  if (fcm !== undefined) byType.set("gcm", fcm)
  return { get: (routerType) => byType.get(routerType.toLowerCase()), platforms: routers.map((r) => r.platform) }
}

export class Bridges extends Context.Service<Bridges, BridgesService>()("autopush/bridges/Bridges") {
  /** The configured bridges; APNs sessions are closed when the layer is released. */
  static readonly layer = (options: BridgeOptions): Layer.Layer<Bridges> =>
    Layer.effect(
      Bridges,
      Effect.gen(function*() {
        const routers: Array<BridgeRouter> = []
        if (options.fcm !== undefined) routers.push(makeFcmRouter(options.fcm))
        if (options.apns !== undefined) {
          const apns = makeApnsRouter(options.apns)
          yield* Effect.addFinalizer(() => apns.close)
          routers.push(apns)
        }
        if (options.adm !== undefined) routers.push(makeAdmRouter(options.adm))
        if (options.stub === true) routers.push(makeStubRouter())
        return make(routers)
      })
    )

  /** No bridges: every bridged user is answered 502/900, every registration 400/108. */
  static readonly none: Layer.Layer<Bridges> = Layer.succeed(Bridges, make([]))
}

// ── configuration ────────────────────────────────────────────────────────────────────────────────

/** The bridge options as configured: JSON maps, durations in seconds. */
export interface BridgeSettings {
  readonly stub: boolean
  readonly fcmCredentials?: string | undefined
  readonly fcmMinTtl: number
  readonly fcmMaxTtl: number
  readonly fcmTimeoutMs: number
  readonly fcmBaseUrl: string
  readonly apnsChannels?: string | undefined
  readonly apnsTimeoutMs: number
  readonly apnsBaseUrl?: string | undefined
  readonly apnsCa?: string | undefined
  readonly admCredentials?: string | undefined
  readonly admMinTtl: number
  readonly admMaxTtl: number
  readonly admTimeoutMs: number
  readonly admBaseUrl: string
}

class Invalid extends Error {}

type Json = Readonly<Record<string, unknown>>

const isObject = (value: unknown): value is Json => typeof value === "object" && value !== null && !Array.isArray(value)

const readText = (path: string): string => {
  try {
    return readFileSync(path, "utf8")
  } catch {
    throw new Invalid(`cannot read the file ${path}`)
  }
}

const jsonObject = (text: string, what: string): Json => {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    throw new Invalid(`${what} is not valid JSON`)
  }
  if (!isObject(value)) throw new Invalid(`${what} is not a JSON object`)
  return value
}

/** A non-empty JSON object of objects (by app id, channel or profile). */
const jsonMap = (text: string): Readonly<Record<string, Json>> => {
  const value = jsonObject(text, "the value")
  if (Object.keys(value).length === 0) throw new Invalid("expected a non-empty JSON object")
  for (const [key, entry] of Object.entries(value)) if (!isObject(entry)) throw new Invalid(`${key}: expected an object`)
  return value as Readonly<Record<string, Json>>
}

const field = (entry: Json, where: string, name: string): string => {
  const value = entry[name]
  if (typeof value !== "string" || value === "") throw new Invalid(`${where}: ${name} must be a non-empty string`)
  return value
}

const optionalField = (entry: Json, where: string, name: string): string | undefined =>
  entry[name] === undefined ? undefined : field(entry, where, name)

const fcmApps = (text: string): Record<string, FcmApp> =>
  Object.fromEntries(Object.entries(jsonMap(text)).map(([appId, entry]) => {
    const account = jsonObject(inlineOrFile(field(entry, appId, "credential"), readText), `${appId} credential`)
    const serviceAccount: ServiceAccount = {
      client_email: field(account, `${appId} credential`, "client_email"),
      private_key: Redacted.make(field(account, `${appId} credential`, "private_key")),
      token_uri: optionalField(account, `${appId} credential`, "token_uri")
    }
    return [appId, { projectId: field(entry, appId, "project_id"), serviceAccount }]
  }))

const apnsChannels = (text: string): Record<string, ApnsChannel> =>
  Object.fromEntries(Object.entries(jsonMap(text)).map(([name, entry]) => {
    const keyId = optionalField(entry, name, "key_id")
    const teamId = optionalField(entry, name, "team_id")
    if ((keyId === undefined) !== (teamId === undefined)) throw new Invalid(`${name}: key_id and team_id go together`)
    const key = Redacted.make(inlineOrFile(field(entry, name, "key"), readText))
    const channel: ApnsChannel = {
      topic: optionalField(entry, name, "topic") ?? `com.mozilla.org.${name}`,
      sandbox: entry["sandbox"] === true,
      auth: keyId !== undefined && teamId !== undefined
        ? { kind: "token", key, keyId, teamId }
        : { kind: "certificate", key, cert: inlineOrFile(field(entry, name, "cert"), readText) }
    }
    return [name, channel]
  }))

const admProfiles = (text: string): Record<string, AdmProfile> =>
  Object.fromEntries(Object.entries(jsonMap(text)).map(([name, entry]) => [name, {
    clientId: field(entry, name, "client_id"),
    clientSecret: Redacted.make(field(entry, name, "client_secret"))
  }]))

/** Parse one option; a bad value stops the node with a line naming the option (never its value: it holds secrets). */
const parse = <A>(option: string, text: string | undefined, f: (text: string) => A): A | undefined => {
  if (text === undefined) return undefined
  try {
    return f(text)
  } catch (error) {
    const why = error instanceof Invalid ? error.message : "unusable value"
    throw new StartupError({ message: `option ${option} is not usable: ${why}` })
  }
}

/** The bridge options from the settings; fails with one line naming the option at fault. */
export const bridgeOptionsOf = (settings: BridgeSettings): Effect.Effect<BridgeOptions, StartupError> =>
  Effect.try({
    try: (): BridgeOptions => {
      const apps = parse("fcm_credentials", settings.fcmCredentials, fcmApps)
      const channels = parse("apns_channels", settings.apnsChannels, apnsChannels)
      const profiles = parse("adm_credentials", settings.admCredentials, admProfiles)
      const ca = parse("apns_ca", settings.apnsCa, (text) => inlineOrFile(text, readText))
      return {
        stub: settings.stub,
        fcm: apps && {
          apps,
          minTtl: settings.fcmMinTtl,
          maxTtl: settings.fcmMaxTtl,
          timeoutMs: settings.fcmTimeoutMs,
          baseUrl: settings.fcmBaseUrl
        },
        apns: channels && { channels, baseUrl: settings.apnsBaseUrl, ca, timeoutMs: settings.apnsTimeoutMs },
        adm: profiles && {
          profiles,
          minTtl: settings.admMinTtl,
          maxTtl: settings.admMaxTtl,
          timeoutMs: settings.admTimeoutMs,
          baseUrl: settings.admBaseUrl
        }
      }
    },
    catch: (error) => error instanceof StartupError ? error : new StartupError({ message: `bridge options are not usable: ${String(error)}` })
  })
