import { layerMemory } from "../../src/storage/memory/layer.ts"
import { storageContract } from "./contract.ts"

storageContract("in-memory", layerMemory)
