-- Argo CD health check for perfdiag.io/PerfDiagnosis (resource.customizations.health.perfdiag.io_PerfDiagnosis).
--
-- A PerfDiagnosis is a one-shot probe of a training job, not part of the application: by
-- default a diagnosis that failed (or cannot proceed, Stalled) or that found a problem leaves
-- the application Healthy, with the reason in the message. Opt in per object with the
-- annotation perfdiag.io/degrade-app:
--   "on-failure": a Failed or Stalled diagnosis is Degraded;
--   "on-finding": that, and also a verdict other than healthy.
local hs = {}
local annotations = (obj.metadata and obj.metadata.annotations) or {}
local degrade = annotations["perfdiag.io/degrade-app"] or ""

if obj.metadata and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted"
  return hs
end
if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the perfdiag operator"
  return hs
end
local status = obj.status
if status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "the operator has not seen generation " .. tostring(obj.metadata.generation) .. " yet"
  return hs
end

local function condition(kind)
  if status.conditions == nil then return nil end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then return c end
  end
  return nil
end
local ready = condition("Ready")
local stalled = condition("Stalled")
local function text(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then return c.message end
  return fallback
end

local failing = degrade == "on-failure" or degrade == "on-finding"
if status.phase == "Failed" or (stalled ~= nil and stalled.status == "True") then
  local what = (status.phase == "Failed") and "diagnosis failed" or "diagnosis stalled"
  hs.message = what .. ": " .. text(stalled, text(ready, status.phase))
  if failing then hs.status = "Degraded" else hs.status = "Healthy" end
  return hs
end
if status.phase == "Succeeded" then
  local verdict = status.verdict or {}
  local summary = verdict.summary or ""
  hs.message = (verdict.status or "unknown") .. ": " .. summary
  if degrade == "on-finding" and verdict.status ~= nil and verdict.status ~= "healthy" then
    hs.status = "Degraded"
  else
    hs.status = "Healthy"
  end
  return hs
end
hs.status = "Progressing"
hs.message = status.phase .. ": " .. text(ready, "in progress")
return hs
