import { defineConfig } from "vitest/config"

/**
 * `npm run test:month-turn`: real processes and real storage while the month turns, their wall
 * clock moved by libfaketime (Debian's `faketime` package, a system package: not part of `npm test`,
 * whose test/**\/*.test.ts does not match test/month-turn/*.month.ts). Files run one after another:
 * each moves the clock of the processes it starts, and the timing of its steps matters.
 */
export default defineConfig({
  test: {
    // A failing test's logs are printed with it; a passing test's are dropped.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts", "test/setup/postgres.ts"],
    include: ["test/month-turn/**/*.month.ts"],
    fileParallelism: false,
    testTimeout: 90_000,
    hookTimeout: 90_000,
    reporters: ["verbose"]
  }
})
