/** Configuration as the tools, the entrypoints and the tests read it: loading settings, and their types. */
export {
  builtRouterUrl,
  changedSettings,
  ConfigError,
  HelpRequested,
  isConfigFlag,
  loadSettings,
  loadSettingsAndFiles,
  makeSettings,
  requireSecrets
} from "./load.ts"
export type { Role, Settings } from "./options.ts"
