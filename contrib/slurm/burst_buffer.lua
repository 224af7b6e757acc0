-- tierstack slurm install: burst_buffer/lua script for SLURM (21.08+), written by
-- `tierstack slurm install`. Thin on purpose: each hook runs `tierstack slurm HOOK ...`
-- and hands its exit status and last output line back to SLURM. Every hook is bounded by
-- SLURM's own timeouts (burst_buffer.conf) and by the --timeout passed here.
-- Edit with `tierstack slurm install` (it rewrites this file), not by hand.

local TIERSTACK = "@TIERSTACK@"
local FAST_DIR = "@FAST_DIR@"
local POOL_SIZE = "@POOL_SIZE@"
local STAGE_TIMEOUT = @STAGE_TIMEOUT@
local OTHER_TIMEOUT = @OTHER_TIMEOUT@
local DRAIN_RATE = "@DRAIN_RATE@"

local function q(s)
	return "'" .. string.gsub(tostring(s), "'", "'\\''") .. "'"
end

-- Runs `tierstack slurm HOOK ARGS...`; returns slurm.SUCCESS or slurm.ERROR, and the last
-- non-empty line it printed (all of it with `whole`).
local function run(hook, timeout, args, whole)
	local cmd = q(TIERSTACK) .. " slurm " .. hook
	for _, a in ipairs(args) do
		cmd = cmd .. " " .. q(a)
	end
	cmd = cmd .. " --fast-dir " .. q(FAST_DIR) .. " --pool-size " .. q(POOL_SIZE)
		.. " --timeout " .. tostring(timeout)
	if DRAIN_RATE ~= "" then
		cmd = cmd .. " --drain-rate " .. q(DRAIN_RATE)
	end
	local out = os.tmpname()
	local rc = os.execute(cmd .. " >" .. q(out) .. " 2>&1 </dev/null")
	local text = ""
	local f = io.open(out, "r")
	if f then
		text = f:read("*a") or ""
		f:close()
	end
	os.remove(out)
	local msg = text
	if not whole then
		msg = ""
		for line in string.gmatch(text, "[^\n]+") do
			if string.find(line, "%S") then
				msg = line
			end
		end
		msg = string.gsub(msg, "^tierstack: error: ", "")
	end
	-- Lua 5.1: os.execute returns the wait status (0 on success); 5.2+: true/nil.
	if rc == 0 or rc == true then
		slurm.log_info("tierstack %s: %s", hook, msg)
		return slurm.SUCCESS, msg
	end
	if msg == "" then
		msg = "tierstack slurm " .. hook .. " failed (status " .. tostring(rc) .. ")"
	end
	slurm.log_error("tierstack %s: %s", hook, msg)
	return slurm.ERROR, msg
end

function slurm_bb_job_process(job_script, uid, gid)
	local args = { job_script }
	if uid ~= nil and gid ~= nil then
		table.insert(args, "--uid")
		table.insert(args, uid)
		table.insert(args, "--gid")
		table.insert(args, gid)
	end
	return run("job-process", OTHER_TIMEOUT, args)
end

function slurm_bb_pools()
	local rc, json = run("pools", OTHER_TIMEOUT, {})
	return rc, json
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	return run("teardown", OTHER_TIMEOUT, { job_id, job_script, tostring(hurry) })
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	return run("setup", OTHER_TIMEOUT,
		{ job_id, uid, gid, tostring(pool), tostring(bb_size), job_script })
end

function slurm_bb_data_in(job_id, job_script)
	return run("data-in", STAGE_TIMEOUT, { job_id, job_script })
end

function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
	return run("paths", OTHER_TIMEOUT, { job_id, job_script, path_file })
end

function slurm_bb_pre_run(job_id, job_script)
	return run("pre-run", OTHER_TIMEOUT, { job_id, job_script })
end

function slurm_bb_post_run(job_id, job_script)
	return run("post-run", OTHER_TIMEOUT, { job_id, job_script })
end

function slurm_bb_data_out(job_id, job_script)
	return run("data-out", STAGE_TIMEOUT, { job_id, job_script })
end

function slurm_bb_get_status(...)
	local args = { ... }
	local pass = {}
	for _, a in ipairs(args) do
		table.insert(pass, tostring(a))
	end
	return run("get-status", OTHER_TIMEOUT, pass, true)
end
