import { defineConfig } from "vitest/config"

/** The storage contract against Amazon DynamoDB Local (needs Java): `npm run test:dynamodb-local`. */
export default defineConfig({
  test: {
    include: ["test/storage/*.dynamodb-local.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000
  }
})
