import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Logs of passing tests are dropped (many provoke failures on purpose and the service logs them);
    // a failing test's logs are printed with it.
    silent: "passed-only",
    globalSetup: ["test/setup/tmpdir.ts", "test/setup/postgres.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000
  }
})
