import { defineConfig } from "vitest/config"

/** The storage contract against Amazon DynamoDB Local (needs Java): `npm run test:dynamodb-local`. */
export default defineConfig({
  test: {
    // A failing test's logs are printed with it; a passing test's are dropped.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts"],
    include: ["test/storage/*.dynamodb-local.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000
  }
})
