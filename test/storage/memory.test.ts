import { layerMemory } from "../../src/storage/memory.ts"
import { storageContract } from "./contract.ts"

storageContract("in-memory", layerMemory)
