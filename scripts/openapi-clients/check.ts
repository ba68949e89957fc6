// Type-checked with the types openapi-typescript generated from the server's document (schema.d.ts beside this
// file, by scripts/test-openapi-clients): the document's tuples are typed as tuples, of their length and
// element types, and an answer's type is reached by path, method and status as a client library reaches it.
import type { components, paths } from "./schema";

type Schemas = components["schemas"];

const point: Schemas["MetricSeries"]["points"][number] = [1_700_000_000_000, 0.5];
const units: Schemas["Placement"]["units"][number] = ["cpu.small", "Reserved", 2];
// @ts-expect-error a point is [atMs, value], nothing after it
const longPoint: Schemas["MetricSeries"]["points"][number] = [1, 2, 3];
// @ts-expect-error units are [spec, resourceType, units]
const unitsOutOfOrder: Schemas["Placement"]["units"][number] = [2, "cpu.small", "Reserved"];

type TaskAnswer = paths["/api/v1/tasks/{id}"]["get"]["responses"]["200"]["content"]["application/json"];
const placedUnits = (task: TaskAnswer): [string, string, number][] => task.placement?.units ?? [];

export { point, units, longPoint, unitsOutOfOrder, placedUnits };
