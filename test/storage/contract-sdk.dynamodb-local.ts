/**
 * The contract against Amazon DynamoDB Local with credentials in the environment: the storage layer
 * then goes through the AWS SDK, signing every request (SigV4), as against AWS itself.
 */
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { storageContract } from "./contract.ts"
import { dynamoDbLocal } from "./dynamodb-local.ts"

process.env["AWS_ACCESS_KEY_ID"] = "autopush"
process.env["AWS_SECRET_ACCESS_KEY"] = "autopush"

const endpoint = dynamoDbLocal()

storageContract("DynamoDB Local through the AWS SDK", (options) => layerDynamo({ ...options, endpoint: endpoint(), region: "local" }))
