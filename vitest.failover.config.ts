import { defineConfig } from "vitest/config"

/**
 * `npm run test:failover`: a PostgreSQL primary and its synchronous standby (Debian's postgresql,
 * clusters of the lane's own), the primary killed under load and the standby promoted beneath real
 * node processes. Not part of `npm test` (test/**\/*.test.ts does not match
 * test/failover/*.failover.ts): it runs two clusters and four node processes at a steady push
 * rate for a minute, and its steps are timed against each other.
 */
export default defineConfig({
  test: {
    // A failing test's logs are printed with it; a passing test's are dropped.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts"],
    include: ["test/failover/**/*.failover.ts"],
    fileParallelism: false,
    testTimeout: 120_000,
    hookTimeout: 90_000,
    reporters: ["verbose"]
  }
})
