/**
 * The contract against Amazon DynamoDB Local, spoken to as a local endpoint without credentials is:
 * the DynamoDB JSON protocol over HTTP with placeholder credentials. Its own lane, since it needs
 * Java: `npm run test:dynamodb-local` (vitest.dynamodb-local.config.ts).
 */
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { storageContract } from "./contract.ts"
import { dynamoDbLocal } from "./dynamodb-local.ts"
import { schemaSuite } from "./schema.ts"

const endpoint = dynamoDbLocal()

storageContract("DynamoDB Local", (options) => layerDynamo({ ...options, endpoint: endpoint(), region: "local" }))
schemaSuite("DynamoDB Local", endpoint, { ttl: true })
