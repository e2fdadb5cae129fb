import { defineConfig } from "vitest/config"

/**
 * `npm run test:rolling`: a rolling restart of three connection nodes behind HAProxy (Debian's
 * `haproxy`, a system package: not part of `npm test`, whose test/**\/*.test.ts does not match
 * test/rolling/*.rolling.ts), real processes on the PostgreSQL test server.
 */
export default defineConfig({
  test: {
    // A failing test's logs are printed with it; a passing test's are dropped.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts"],
    include: ["test/rolling/**/*.rolling.ts"],
    fileParallelism: false,
    // About 30 s on a quiet 2-core machine; the bound leaves room for a loaded one.
    testTimeout: 600_000,
    hookTimeout: 120_000,
    reporters: ["verbose"]
  }
})
