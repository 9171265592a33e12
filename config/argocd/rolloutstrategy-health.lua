-- Argo CD health check for ballast.dev/RolloutStrategy (docs/gitops.md).
--
-- The status is kstatus-compatible: status.observedGeneration, and the conditions Ready,
-- Reconciling and Stalled (with the legacy Progressing and Failed). The phase (status.phase)
-- adds what kstatus cannot say: a revision waiting for a manual approval, or for the decision
-- of an external engine (a webhook hook answered 202 Accepted), is Suspended.
-- Fields: docs/rollout-strategy.md, src/api/rollout_strategy.rs.
--
-- Argo CD runs this in gopher-lua (Lua 5.1) with only the base, table and os libraries: no
-- string or math functions here, plain concatenation only.
--
-- Keep config/argocd/argocd-cm-patch.yaml identical (tests/argocd_health.rs checks it).

local hs = {}

local function condition(conditionType)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function isTrue(conditionType)
  local c = condition(conditionType)
  return c ~= nil and c.status == "True"
end

-- The status message when the operator wrote one, else the given text.
local function statusMessage(default)
  if obj.status ~= nil and obj.status.message ~= nil and obj.status.message ~= "" then
    return obj.status.message
  end
  return default
end

-- A number from the object (Argo CD may hand large integers over as strings), or nil.
local function number(value)
  if value == nil then
    return nil
  end
  return tonumber(value)
end

local generation = nil
if obj.metadata ~= nil then
  generation = number(obj.metadata.generation)
end

-- A strategy whose target is governed by an older strategy stands aside (Ready False, reason
-- Conflicted). Checked first: targetRef is immutable, so no newer generation can undo it.
local ready = condition("Ready")
if ready ~= nil and ready.status == "False" and ready.reason == "Conflicted" then
  hs.status = "Degraded"
  hs.message = statusMessage(ready.message)
  if hs.message == nil or hs.message == "" then
    hs.message = "another RolloutStrategy governs the same Deployment; this one stands aside"
  end
  return hs
end

-- Stalled at this very generation (e.g. InvalidSpec: a stored spec this operator cannot read,
-- reported on the conditions alone, without moving status.observedGeneration).
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" and generation ~= nil
    and number(stalled.observedGeneration) == generation then
  hs.status = "Degraded"
  hs.message = stalled.message
  if hs.message == nil or hs.message == "" then
    hs.message = statusMessage("stalled: " .. (stalled.reason or "unknown reason"))
  end
  return hs
end

-- Nothing in the status speaks for this generation yet.
local observed = nil
if obj.status ~= nil then
  observed = number(obj.status.observedGeneration)
end
if obj.status == nil or observed == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  if generation ~= nil then
    hs.message = "waiting for the operator to observe generation " .. generation
  else
    hs.message = "waiting for the operator to observe this RolloutStrategy"
  end
  if observed ~= nil then
    hs.message = hs.message .. " (status is of generation " .. observed .. ")"
  end
  return hs
end

local phase = obj.status.phase
local revision = obj.status.currentRevision

-- A mid hook that is a manual gate: the rollout waits, paused, for a person.
if phase == "WaitingApproval" then
  local name = obj.metadata.name or "<name>"
  local command = "kubectl annotate rolloutstrategy " .. name .. " ballast.dev/approve="
      .. (revision or "<status.currentRevision>")
  if obj.metadata.namespace ~= nil then
    command = command .. " -n " .. obj.metadata.namespace
  end
  local hook = obj.status.currentHook or "an approval gate"
  hs.status = "Suspended"
  hs.message = statusMessage("revision " .. (revision or "?") .. " waits for approval at " .. hook)
      .. "; approve with: " .. command
  return hs
end

-- A webhook hook answered 202 Accepted: its engine approves or aborts with the same
-- annotations (docs/external-engines.md); a person may decide in its place.
if phase == "WaitingExternal" then
  local name = obj.metadata.name or "<name>"
  local value = revision or "<status.currentRevision>"
  local suffix = ""
  if obj.metadata.namespace ~= nil then
    suffix = " -n " .. obj.metadata.namespace
  end
  local hook = obj.status.currentHook or "a webhook hook"
  hs.status = "Suspended"
  hs.message = statusMessage("revision " .. (revision or "?")
      .. " waits for the external engine of " .. hook)
      .. "; the external engine decides; to decide in its place: kubectl annotate rolloutstrategy "
      .. name
      .. " ballast.dev/approve=" .. value .. suffix
  return hs
end

if isTrue("Stalled") or phase == "Failed" or phase == "RolledBack" then
  hs.status = "Degraded"
  if phase == "RolledBack" then
    hs.message = statusMessage("revision " .. (revision or "?") .. " failed and was rolled back")
  elseif phase == "Failed" and obj.spec ~= nil and obj.spec.onFailure == "Halt" then
    hs.message = statusMessage("revision " .. (revision or "?")
        .. " failed; its Deployment is held paused (onFailure: Halt)")
  else
    hs.message = statusMessage("revision " .. (revision or "?") .. " failed")
  end
  return hs
end

if isTrue("Reconciling") or phase == "PreHook" or phase == "Rolling" or phase == "MidHook"
    or phase == "PostHook" then
  hs.status = "Progressing"
  local default = "revision " .. (revision or "?") .. " is in phase " .. (phase or "?")
  if obj.status.currentHook ~= nil then
    default = default .. " (hook " .. obj.status.currentHook .. ")"
  end
  hs.message = statusMessage(default)
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = statusMessage("revision " .. (revision or "?") .. " is at rest")
  return hs
end

-- No verdict in the conditions (Ready False or Unknown for another reason, or no Ready yet).
hs.status = "Progressing"
if ready ~= nil then
  hs.message = statusMessage(ready.message or ("Ready is " .. (ready.status or "unset")))
else
  hs.message = statusMessage("waiting for the Ready condition")
end
return hs
