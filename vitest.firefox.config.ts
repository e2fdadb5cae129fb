import { defineConfig } from "vitest/config"

/**
 * `npm run test:e2e`: the end-to-end suite with real Firefox (test/firefox/*.firefox.ts, which the
 * default config's test/**\/*.test.ts does not match). One Firefox at a time: files run one after another.
 */
export default defineConfig({
  test: {
    // A failing test's logs are printed with it; a passing test's are dropped.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts", "test/setup/postgres.ts"],
    include: ["test/firefox/**/*.firefox.ts"],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 90_000,
    reporters: ["verbose"]
  }
})
