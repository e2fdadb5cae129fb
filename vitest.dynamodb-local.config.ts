import { defineConfig } from "vitest/config"

/** The storage contract against Amazon DynamoDB Local (needs Java): `npm run test:dynamodb-local`. */
export default defineConfig({
  test: {
    // A failing test's logs are printed with it; a passing test's are dropped.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts"],
    include: ["test/storage/*.dynamodb-local.ts"],
    // One DynamoDB Local (a JVM) at a time: two at once starve a small machine.
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 120_000
  }
})
