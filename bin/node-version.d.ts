export declare const MINIMUM_NODE: string
export declare const runsSources: (version: string) => boolean
export declare const tooOldNode: (entrypoint: string, version: string) => string | undefined
