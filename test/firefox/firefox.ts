/**
 * The system Firefox (Debian's `firefox-esr`), headless, driven over WebDriver BiDi with
 * `puppeteer-core`. We start the process ourselves (puppeteer only connects), so that every line
 * Firefox prints from its very start is kept: with `dom.push.loglevel` = Debug and chrome console
 * output on stdout, Firefox's push service logs every frame it sends and receives. Those lines are
 * the client-side transcript of a session, printed when a test fails.
 *
 * A profile is a plain directory we own: the prefs are written to its `user.js` before every start,
 * and everything Firefox stores (the push uaid in prefs.js, subscriptions in IndexedDB, service
 * workers) stays in it across restarts.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { existsSync, mkdirSync, writeFileSync } from "node:fs"
import puppeteer, { type Browser } from "puppeteer-core"

/** The system Firefox: FIREFOX_BIN, else firefox-esr or firefox on the PATH. Never downloaded. */
export const firefoxPath = (): string => {
  const fromEnv = process.env["FIREFOX_BIN"]
  if (fromEnv !== undefined && fromEnv !== "") return fromEnv
  for (const name of ["firefox-esr", "firefox"]) {
    try {
      const found = execFileSync("sh", ["-c", `command -v ${name}`], { encoding: "utf8" }).trim()
      if (found !== "") return found
    } catch {
      // not on the PATH
    }
  }
  throw new Error("no Firefox found: install Debian's firefox-esr (apt-get install firefox-esr) or set FIREFOX_BIN")
}

/** What Firefox needs for our push server, plus what keeps it quiet on a machine without internet. */
const prefs = (pushUrl: string): Record<string, string | number | boolean> => ({
  // Push against our server.
  "dom.push.serverURL": pushUrl,
  "dom.push.testing.allowInsecureServerURL": true,
  // The remote agent's recommended prefs turn the push connection off; a user pref wins.
  "dom.push.connection.enabled": true,
  "dom.push.testing.ignorePermission": true,
  "dom.push.enabled": true,
  "dom.serviceWorkers.enabled": true,
  // Reconnect quickly after a server restart (default 5 s, doubling per failed attempt).
  "dom.push.retryBaseInterval": 500,
  // No per-subscription quota for pushes that show no notification.
  "dom.push.maxQuotaPerSubscription": 1000,
  // Every frame in the log: "wsSendMessage: Sending message" and "wsOnMessageAvailable()".
  "dom.push.loglevel": "Debug",
  "devtools.console.stdout.chrome": true,
  "devtools.console.stdout.content": false,
  // Memory: one content process, none prelaunched.
  "dom.ipc.processCount": 1,
  "dom.ipc.processPrelaunch.enabled": false,
  "fission.autostart": false,
  "fission.webContentIsolationStrategy": 0,
  // Quiet offline: no updates, telemetry, remote settings, safe browsing, captive portal, etc.
  "app.update.disabledForTesting": true,
  "app.update.auto": false,
  "app.update.checkInstallTime": false,
  "app.normandy.enabled": false,
  "app.normandy.api_url": "",
  "app.shield.optoutstudies.enabled": false,
  "messaging-system.rsexperimentloader.enabled": false,
  "browser.shell.checkDefaultBrowser": false,
  "browser.startup.homepage": "about:blank",
  "browser.startup.homepage_override.mstone": "ignore",
  "browser.startup.page": 0,
  "browser.newtabpage.enabled": false,
  "browser.newtabpage.activity-stream.feeds.system.topstories": false,
  "browser.newtabpage.activity-stream.feeds.snippets": false,
  "browser.aboutwelcome.enabled": false,
  "browser.safebrowsing.blockedURIs.enabled": false,
  "browser.safebrowsing.downloads.enabled": false,
  "browser.safebrowsing.malware.enabled": false,
  "browser.safebrowsing.phishing.enabled": false,
  "browser.safebrowsing.update.enabled": false,
  "browser.safebrowsing.provider.mozilla.updateURL": "",
  "browser.search.update": false,
  "browser.search.geoip.url": "",
  "browser.region.network.url": "",
  "browser.region.update.enabled": false,
  "browser.sessionstore.resume_from_crash": false,
  "browser.urlbar.suggest.searches": false,
  "browser.ping-centre.telemetry": false,
  "browser.translations.automaticallyPopup": false,
  "browser.uitour.enabled": false,
  "browser.contentblocking.features.standard": "-tp,tpPrivate,cookieBehavior0,-cryptoTP,-fp",
  "captivedetect.canonicalURL": "",
  "network.captive-portal-service.enabled": false,
  "network.connectivity-service.enabled": false,
  "network.dns.disablePrefetch": true,
  "network.http.speculative-parallel-limit": 0,
  "network.manage-offline-status": false,
  "network.predictor.enabled": false,
  "network.prefetch-next": false,
  "network.sntp.pools": "dummy.test",
  "datareporting.healthreport.uploadEnabled": false,
  "datareporting.healthreport.service.enabled": false,
  "datareporting.policy.dataSubmissionEnabled": false,
  "datareporting.policy.dataSubmissionPolicyBypassNotification": true,
  "toolkit.telemetry.enabled": false,
  "toolkit.telemetry.unified": false,
  "toolkit.telemetry.archive.enabled": false,
  "toolkit.telemetry.server": "",
  "toolkit.startup.max_resumed_crashes": -1,
  "services.settings.server": "data:,#remote-settings-dummy/v1",
  "extensions.update.enabled": false,
  "extensions.getAddons.cache.enabled": false,
  "extensions.systemAddon.update.enabled": false,
  "extensions.blocklist.enabled": false,
  "media.gmp-manager.updateEnabled": false,
  "geo.provider.testing": true,
  "geo.wifi.scan": false,
  "general.useragent.updates.enabled": false,
  "identity.fxaccounts.enabled": false,
  "security.certerrors.mitm.priming.enabled": false,
  "security.remote_settings.crlite_filters.enabled": false,
  "security.remote_settings.intermediates.enabled": false,
  "screenshots.browser.component.enabled": false,
  "hangmonitor.timeout": 0,
  "dom.ipc.reportProcessHangs": false
})

export interface Firefox {
  readonly browser: Browser
  readonly process: ChildProcess
  /** Resolves once the process has exited (closing it, or a crash). */
  readonly exited: Promise<void>
  /** Closes the browser (BiDi `browser.close`) and waits for the process to exit; kills it if it hangs. */
  readonly close: () => Promise<void>
}

const launchTimeoutMs = 30_000

/**
 * Starts Firefox on `profileDir` (created when missing) and connects puppeteer to it. Every line
 * Firefox prints goes to `log` (shared across restarts, so a test can slice from a mark).
 */
export const launchFirefox = async (options: {
  readonly profileDir: string
  readonly pushUrl: string
  readonly log: Array<string>
}): Promise<Firefox> => {
  const { profileDir, pushUrl, log } = options
  if (!existsSync(profileDir)) mkdirSync(profileDir, { recursive: true })
  const lines = Object.entries(prefs(pushUrl)).map(([k, v]) => `user_pref(${JSON.stringify(k)}, ${JSON.stringify(v)});`)
  writeFileSync(`${profileDir}/user.js`, lines.join("\n") + "\n")

  const child = spawn(
    firefoxPath(),
    ["--headless", "--no-remote", "--profile", profileDir, "--remote-debugging-port=0", "about:blank"],
    {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, MOZ_CRASHREPORTER_DISABLE: "1", MOZ_CRASHREPORTER_SHUTDOWN: "1" },
      detached: true
    }
  )
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  let endpoint: (url: string) => void = () => {}
  const bidiUrl = new Promise<string>((resolve) => (endpoint = resolve))
  const collect = (stream: NodeJS.ReadableStream | null) => {
    let rest = ""
    stream?.on("data", (chunk: Buffer) => {
      const parts = (rest + chunk.toString()).split("\n")
      rest = parts.pop() ?? ""
      for (const line of parts) {
        if (line.trim() === "") continue
        log.push(line)
        const m = /^WebDriver BiDi listening on (ws:\/\/\S+)/.exec(line)
        if (m) endpoint(m[1]!)
      }
    })
  }
  collect(child.stdout)
  collect(child.stderr)

  const kill = () => {
    try {
      // detached: Firefox leads its own process group, which holds its content processes too
      process.kill(-child.pid!, "SIGKILL")
    } catch {
      // already gone
    }
  }
  // Never leave a Firefox behind when the test process ends early.
  process.once("exit", kill)
  void exited.then(() => process.off("exit", kill))
  let timer: NodeJS.Timeout | undefined
  try {
    const url = await Promise.race([
      bidiUrl,
      exited.then(() => Promise.reject(new Error("Firefox exited during startup"))),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`Firefox did not start within ${launchTimeoutMs} ms`)), launchTimeoutMs)
      })
    ])
    const browser = await puppeteer.connect({ browserWSEndpoint: `${url}/session`, protocol: "webDriverBiDi", defaultViewport: null })
    const close = async () => {
      const killer = setTimeout(kill, 10_000)
      try {
        await browser.close().catch(() => {})
        await exited
      } finally {
        clearTimeout(killer)
      }
    }
    return { browser, process: child, exited, close }
  } catch (e) {
    kill()
    await exited
    throw new Error(`${String(e)}\n--- Firefox output ---\n${log.slice(-40).join("\n")}`)
  } finally {
    clearTimeout(timer)
  }
}

/** A frame Firefox's push service sent (`out`) or received (`in`), parsed from its debug log. */
export interface Frame {
  readonly dir: "out" | "in"
  readonly frame: Record<string, unknown>
  readonly raw: string
}

/**
 * The push frames in Firefox's log lines. The console prints each argument as a JSON string, e.g.
 * `console.debug: PushServiceWebSocket: "wsSendMessage: Sending message" "{\"messageType\":\"hello\"}"`.
 */
export const pushFrames = (lines: ReadonlyArray<string>): Array<Frame> => {
  const frames: Array<Frame> = []
  for (const line of lines) {
    const dir = line.includes('"wsSendMessage: Sending message"') ? "out" : line.includes('"wsOnMessageAvailable()"') ? "in" : undefined
    if (dir === undefined) continue
    const m = /" (".*")\s*$/.exec(line)
    if (!m) continue
    try {
      const raw = JSON.parse(m[1]!) as string
      const frame = JSON.parse(raw) as unknown
      frames.push({ dir, frame: typeof frame === "object" && frame !== null ? (frame as Record<string, unknown>) : {}, raw })
    } catch {
      // not a frame we can read; the raw line is still in the log
    }
  }
  return frames
}

/** Connection events of Firefox's push client worth seeing beside the frames. */
const lifecycle =
  /PushServiceWebSocket: "(beginWSSetup: Connecting to|wsOnStart\(\)|wsOnServerClose\(\)|wsOnStop: |startBackoffTimer: Retry in|timeOutRequests: |sendPing\(\)|handleHelloReply: |wsOnMessageAvailable: Invalid)/

/**
 * The frames as a transcript, `FF -> …` and `<- SV …`, with Firefox's connection events
 * (`(FF) …`: connecting, closes, retries, request timeouts) and its push warnings in between.
 */
export const transcript = (lines: ReadonlyArray<string>): string => {
  const out: Array<string> = []
  for (const line of lines) {
    const [frame] = pushFrames([line])
    if (frame !== undefined) out.push(frame.dir === "out" ? `FF -> ${frame.raw}` : `<- SV ${frame.raw}`)
    else if (lifecycle.test(line) || /^console\.(warn|error): Push/.test(line)) out.push(`   (FF) ${line.replace(/^console\.\w+: /, "")}`)
  }
  return out.join("\n")
}
