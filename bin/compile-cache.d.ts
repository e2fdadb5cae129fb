export declare const COMPILE_CACHE: string
export declare const enableServiceCompileCache: () => unknown
