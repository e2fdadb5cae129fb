/** Configuration: the option table, loading, and the docs generated from the table. */
export { helpText, optionsTable, sampleIni } from "./docs.ts"
export type { OptionRow } from "./docs.ts"
export {
  changedSettings,
  ConfigError,
  HelpRequested,
  iniLocations,
  loadSettings,
  loadSettingsAndFiles,
  makeSettings,
  redactedSettings,
  requireSecrets
} from "./load.ts"
export type { LoadInput } from "./load.ts"
export { options, roleScopes } from "./options.ts"
export type { OptionName, OptionValue, OptionValues, Role, Scope, SecretOption, Settings } from "./options.ts"
